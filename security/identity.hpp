// Who is who in a secured run: the cluster CA, and one certificate per coordinator, node and
// admin shell, each naming its holder and role. Plain OpenSSL 3, no CAF: the actors, the data
// channel (net/tls.hpp) and `fusion-cluster certs` all read identities the same way.
//
// A certificate's subject carries the holder's name in CN and its role in OU
// ("coordinator", "node" or "admin"); the run's CA signs them all (security/certs.hpp makes
// them). The CA's own subject has OU "ca".
//
// Proof of a name over CAF (docs/security.md): CAF 0.17's OpenSSL module checks that the peer
// holds *some* certificate of the run's CA but does not tell the actors which one. The actors
// therefore prove names with a challenge: each side signs the other's fresh nonce with its
// private key (`credentials::sign`) and the other checks the signature against the certificate
// sent along (`credentials::verify_peer` + `verify_signature`). Both sides prove themselves, so a
// node that holds a valid certificate cannot relay another node's proof.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.hpp"

struct x509_st;
struct evp_pkey_st;
struct x509_store_st;

namespace fusion::security {

/// What a certificate entitles its holder to.
enum class role { coordinator, node, admin };

/// "coordinator", "node" or "admin".
const char* to_string(role r);
/// The role named by `text`, or nullopt.
std::optional<role> role_from_string(std::string_view text);

/// The holder named by a certificate.
struct identity {
  std::string name;
  role r = role::node;
};

/// CN and OU of `cert`; fails when either is missing or OU is no role.
result<identity> identity_of(const x509_st* cert);

/// The three files a process presents: the cluster CA, its certificate and its private key.
struct identity_files {
  std::string ca;
  std::string certificate;
  std::string key;
};

/// A process's loaded identity: the CA to check peers against, its own certificate and key.
/// Loading checks that the certificate was issued by the CA, has not expired and matches the key,
/// so a mix-up of files fails at start-up, naming the file, not at the first handshake.
class credentials {
 public:
  /// Loads and cross-checks the files; throws std::runtime_error naming the file and the problem.
  static std::shared_ptr<const credentials> load(const identity_files& files);
  ~credentials();
  credentials(const credentials&) = delete;
  credentials& operator=(const credentials&) = delete;

  /// The holder of this process's certificate.
  const identity& self() const noexcept { return self_; }
  const identity_files& files() const noexcept { return files_; }
  /// This process's certificate in PEM.
  const std::string& certificate_pem() const noexcept { return cert_pem_; }

  /// ECDSA/RSA signature (SHA-256) of `message` with this process's key, as raw bytes.
  std::string sign(std::string_view message) const;
  /// Checks that `cert_pem` was issued by this run's CA and is valid now; returns its holder, or
  /// fails in plain words ("not signed by this cluster's CA", "expired", ...).
  result<identity> verify_peer(std::string_view cert_pem) const;
  /// Checks `signature` over `message` against the public key of `cert_pem`.
  static bool verify_signature(std::string_view cert_pem, std::string_view message, std::string_view signature);

 private:
  credentials() = default;
  identity_files files_;
  identity self_;
  std::string cert_pem_;
  evp_pkey_st* key_ = nullptr;
  x509_store_st* store_ = nullptr;
};

/// 32 random bytes from OpenSSL's CSPRNG, hex-encoded: a one-time challenge.
std::string random_nonce();

/// What a prover signs: the purpose, both nonces and the claimed name, length-prefixed so that
/// no two different tuples give the same bytes.
std::string proof_message(std::string_view purpose, std::string_view challenger_nonce, std::string_view prover_nonce,
                          std::string_view name);

}  // namespace fusion::security
