// Where CAF meets the run's identities (security/): CAF's OpenSSL module for every published
// actor and remote connection when a process has credentials, plaintext otherwise
// (security.mode=off), and the admission handshake's CAF side (security/admission.hpp).
//
// CAF 0.17's OpenSSL module checks that the peer's certificate comes from the run's CA (both
// ways) but tells the actors nothing about which one; the names and roles are therefore proven
// with challenge_atom and a security::proof in the join (node_hello) and login (admin) messages.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "base/result.hpp"
#include "security/admission.hpp"
#include "security/identity.hpp"

namespace fusion {

/// Loads the middleman and, with credentials, CAF's OpenSSL module with the process's
/// certificate, key and CA (mutual authentication). Call before constructing the actor system.
void load_network(caf::actor_system_config& cfg, const security::credentials* creds);

/// Publishes `whom` (with its typed interface, if any) on host:port, through TLS when `tls`.
template <class Handle>
caf::expected<uint16_t> publish_actor(const Handle& whom, uint16_t port, const std::string& host, bool tls) {
  if (tls) return caf::openssl::publish(whom, port, host.c_str(), true);
  return whom.home_system().middleman().publish(whom, port, host.c_str(), true);
}

/// Connects to the actor published on host:port, through TLS when `tls`.
template <class Handle = caf::actor>
caf::expected<Handle> connect_actor(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls) {
  if (tls) return caf::openssl::remote_actor<Handle>(sys, host, port);
  return sys.middleman().remote_actor<Handle>(host, port);
}

/// A connect error in plain words, with the likely cause of a failed TLS handshake.
std::string describe_connect_error(const caf::error& e, bool tls, const std::string& what);

/// Asks `server` to prove that it holds a certificate of role `want` (challenge_atom); returns
/// the server's nonce to answer in our own proof, or fails saying why.
result<std::string> challenge_server(caf::scoped_actor& self, const caf::actor& server,
                                     const security::credentials& creds, security::role want);

/// The server's answer to challenge_atom(client_nonce): a fresh nonce of `book`, our certificate
/// and our signature over the client's nonce.
std::tuple<std::string, security::proof> answer_challenge(const security::credentials& creds,
                                                          security::challenge_book& book,
                                                          const std::string& client_nonce);

}  // namespace fusion
