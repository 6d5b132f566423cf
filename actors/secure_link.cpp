#include "actors/secure_link.hpp"

#include <cstdlib>
#include <cstring>

#include "actors/errors.hpp"

namespace fusion {

void load_network(caf::actor_system_config& cfg, const security::credentials* creds) {
  cfg.load<caf::io::middleman>();
  if (!creds) return;
  cfg.openssl_certificate = creds->files().certificate;
  cfg.openssl_key = creds->files().key;
  cfg.openssl_cafile = creds->files().ca;
  cfg.load<caf::openssl::manager>();
}

std::string describe_connect_error(const caf::error& e, bool tls, const std::string& what) {
  std::string out = describe(e);
  if (tls && e == caf::sec::disconnect_during_handshake)
    return "the TLS handshake with " + what +
           " failed: both sides need security.mode=tls and certificates of the same cluster CA "
           "(fusion-cluster certs); " + what + " refused this certificate or speaks plaintext";
  if (tls && e == caf::sec::cannot_connect_to_node)
    return out + " (if " + what + " runs with security.mode=off, it speaks plaintext and refuses TLS)";
  if (!tls && e == caf::sec::disconnect_during_handshake)
    return out + " (" + what + " may require TLS: this process runs with security.mode=off)";
  return out;
}

result<std::string> challenge_server(caf::scoped_actor& self, const caf::actor& server,
                                     const security::credentials& creds, security::role want) {
  auto mine = security::random_nonce();
  result<std::string> answer = fail("it did not answer the challenge");
  self->request(server, std::chrono::seconds(30), challenge_atom::value, mine)
      .receive(
          [&](std::string& theirs, security::proof& p) {
            if (p.challenge != mine) {
              answer = fail("it answered another challenge");
              return;
            }
            if (auto who = security::check_proof(creds, p, want, {}); !who) {
              answer = who.failed();
              return;
            }
            answer = std::move(theirs);
          },
          [&](caf::error& e) { answer = fail(describe(e)); });
  return answer;
}

std::tuple<std::string, security::proof> answer_challenge(const security::credentials& creds,
                                                          security::challenge_book& book,
                                                          const std::string& client_nonce) {
  // Only our nonce format is signed, so a peer cannot make us sign arbitrary bytes.
  auto challenge = client_nonce.size() == 64 ? client_nonce : std::string(64, '0');
  return {book.issue(), security::make_proof(creds, challenge)};
}

}  // namespace fusion

// ---- a repair of CAF 0.17's OpenSSL sessions ----------------------------------------------------
//
// libcaf_openssl calls SSL_accept, SSL_connect, SSL_read and SSL_write without clearing OpenSSL's
// per-thread error queue first, then asks SSL_get_error, which reports any error still queued
// (OpenSSL's documentation requires an empty queue before each call). Every session of a process
// runs on the middleman's one thread, so a peer that fails its handshake (a plaintext client, a
// certificate of another CA, raw bytes) left an error behind that made the next read of a healthy
// connection fail: the coordinator dropped a joined node (tests/actors/admission_test.cpp). These
// definitions live in every program that links this file, and the dynamic linker binds
// libcaf_openssl's calls to them before libssl's; each clears the queue and calls libssl.
#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

template <class Fn>
Fn next_symbol(const char* name) {
  static_assert(sizeof(Fn) == sizeof(void*));
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) std::abort();  // libssl is linked into every program that links this file
  Fn fn;
  std::memcpy(&fn, &p, sizeof fn);
  return fn;
}

}  // namespace

extern "C" {

int SSL_read(SSL* s, void* buf, int num) {
  static const auto real = next_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(s, buf, num);
}

int SSL_write(SSL* s, const void* buf, int num) {
  static const auto real = next_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(s, buf, num);
}

int SSL_accept(SSL* s) {
  static const auto real = next_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(s);
}

int SSL_connect(SSL* s) {
  static const auto real = next_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(s);
}

}  // extern "C"
