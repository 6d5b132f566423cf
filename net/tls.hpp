// TLS 1.3 for the data channel: both ends present a certificate of the run's CA
// (security/certs.hpp makes them) and check the other's, and each end checks what the other's
// certificate says: its role, and on the connecting side the name of the node it meant to reach.
//
// Handshake (docs/security.md, "The data channel"): TCP connect, TLS 1.3 handshake with mutual
// authentication, then the accepting side checks the peer's role and sends a *welcome* (an ack
// frame with count 0) that the connecting side reads before its connect returns. TLS 1.3 lets a
// client finish its handshake before the server has checked the client's certificate; without
// the welcome, a refused client would learn of its refusal only when a later write failed.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "net/socket.hpp"
#include "net/stream.hpp"
#include "security/identity.hpp"

struct ssl_ctx_st;

namespace fusion::net {

/// A process's TLS settings: its certificate and key, and the CA its peers must be signed by.
/// Shared by every connection of the process (OpenSSL's context is thread-safe once set up).
class tls_context {
 public:
  /// Loads the three files; the error names the file and says what is wrong with it.
  static result<std::shared_ptr<const tls_context>> load(const security::identity_files& files);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  ssl_ctx_st* native() const noexcept { return ctx_; }

 private:
  tls_context() = default;
  ssl_ctx_st* ctx_ = nullptr;
};

/// What the certificate at the other end must say.
struct peer_rule {
  security::role role = security::role::node;
  /// The holder's name (CN); empty accepts any holder of `role`.
  std::string name;
};

/// Accepting side: handshake on the connected socket `fd`, the peer check and the welcome, all
/// before `deadline`. `peer` ("host:port") only names the peer in error messages, which say in
/// plain words why the peer was refused (no certificate, another CA, a wrong role, not TLS).
result<stream> tls_accept(int fd, const tls_context& ctx, const peer_rule& rule,
                          std::chrono::steady_clock::time_point deadline, const std::string& peer);

/// Connecting side: handshake, the check that the server holds `rule`'s certificate, and the
/// server's welcome, before `deadline`.
result<stream> tls_connect(int fd, const tls_context& ctx, const peer_rule& rule,
                           std::chrono::steady_clock::time_point deadline, const std::string& peer);

/// The holder (CN) of the certificate the peer of the TLS stream `io` presented; fails in
/// plaintext or when the certificate names no holder.
result<std::string> peer_certificate_name(const stream& io);

/// Connecting side, to tell why a connection to some TLS service failed (fusion-admin to a
/// coordinator's admin port): the handshake alone, with the server's certificate checked
/// against the CA but not its role, then up to `settle` for the server's first bytes or its
/// refusal of this process's certificate (TLS 1.3 sends that after the client's side of the
/// handshake is done). Fails with why, about the peer: "it does not speak TLS (...)", "its
/// certificate was not issued by this cluster's CA", "it refused this process's certificate
/// (...)", "it closed the connection".
status tls_handshake_check(int fd, const tls_context& ctx, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds settle);

}  // namespace fusion::net
