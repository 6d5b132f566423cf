#include "security/admission.hpp"

#include <algorithm>

namespace fusion::security {

proof make_proof(const credentials& creds, const std::string& challenge) {
  proof p;
  p.certificate = creds.certificate_pem();
  p.nonce = random_nonce();
  p.challenge = challenge;
  p.signature = creds.sign(proof_message(to_string(creds.self().r), challenge, p.nonce, creds.self().name));
  return p;
}

result<identity> check_proof(const credentials& verifier, const proof& p, role want, std::string_view want_name) {
  if (p.certificate.empty() || p.signature.empty())
    return fail("it presented no certificate (is it running with security.mode=off?)");
  auto who = verifier.verify_peer(p.certificate);
  if (!who) return who;
  if (who->r != want)
    return fail(std::string("it holds the certificate of ") + to_string(who->r) + " '" + who->name + "', not " +
                (want == role::admin ? "an " : "a ") + to_string(want) + " certificate");
  if (!want_name.empty() && who->name != want_name)
    return fail("it says it is '" + std::string(want_name) + "' but its certificate names '" + who->name + "'");
  // Bounded sizes: a nonce is 64 hex digits; anything else is not ours and is not hashed.
  if (p.nonce.size() != 64 || p.challenge.size() != 64 ||
      !credentials::verify_signature(p.certificate, proof_message(to_string(want), p.challenge, p.nonce, who->name),
                                     p.signature))
    return fail("its signature does not match its certificate (it does not hold the certificate's key)");
  return who;
}

std::string challenge_book::issue(clock::time_point now) {
  while (!issued_.empty() && (issued_.size() >= capacity_ || now - issued_.front().second > ttl_)) issued_.pop_front();
  issued_.emplace_back(random_nonce(), now);
  return issued_.back().first;
}

bool challenge_book::redeem(const std::string& nonce, clock::time_point now) {
  auto it = std::find_if(issued_.begin(), issued_.end(), [&](const auto& e) { return e.first == nonce; });
  if (it == issued_.end()) return false;
  bool fresh = now - it->second <= ttl_;
  issued_.erase(it);
  return fresh;
}

}  // namespace fusion::security
