// Admission by identity over a channel that only proves "some certificate of this CA": each side
// answers the other's fresh nonce with a signature (docs/security.md). Pure logic, no CAF; the
// actors carry `proof`s in their join and login messages.
//
//   node -> coordinator   challenge(node_nonce)
//   coordinator -> node   proof of the coordinator over node_nonce (the node checks role
//                         coordinator), and the coordinator's own nonce
//   node -> coordinator   hello + proof of the node over the coordinator's nonce (the
//                         coordinator checks role node, the name of the hello, and that it
//                         issued the nonce, once)
// The admin shell logs in the same way with role admin.
#pragma once

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "security/identity.hpp"

namespace fusion::security {

/// A holder's answer to a challenge: its certificate and its signature over
/// proof_message(role, challenge, nonce, name).
struct proof {
  std::string certificate;  ///< PEM
  std::string nonce;        ///< the prover's own fresh nonce
  std::string challenge;    ///< the challenger's nonce being answered
  std::string signature;
};

/// The proof of `creds` answering `challenge`.
proof make_proof(const credentials& creds, const std::string& challenge);

/// Checks `p` with the verifier's CA: the certificate is the CA's and has role `want`, the name
/// is `want_name` unless that is empty, the signature covers `p.challenge` and `p.nonce`. Returns
/// the holder, or fails saying why in plain words ("its certificate names 'b1'", "it holds a node
/// certificate, not an admin one", ...).
result<identity> check_proof(const credentials& verifier, const proof& p, role want, std::string_view want_name);

/// The nonces a challenger has issued and not yet seen answered. Single use, they expire after
/// `ttl`, and at most `capacity` are outstanding (the oldest is forgotten first), so a flood of
/// challenges costs bounded memory.
class challenge_book {
 public:
  using clock = std::chrono::steady_clock;
  explicit challenge_book(size_t capacity = 256, clock::duration ttl = std::chrono::seconds(60))
      : capacity_(capacity), ttl_(ttl) {}
  /// A fresh nonce, remembered.
  std::string issue(clock::time_point now = clock::now());
  /// True once for a nonce that was issued, is unexpired and has not been redeemed.
  bool redeem(const std::string& nonce, clock::time_point now = clock::now());
  size_t outstanding() const noexcept { return issued_.size(); }

 private:
  size_t capacity_;
  clock::duration ttl_;
  std::deque<std::pair<std::string, clock::time_point>> issued_;
};

}  // namespace fusion::security
