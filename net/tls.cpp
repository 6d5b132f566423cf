#include "net/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <poll.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include "net/frame_channel.hpp"
#include "security/openssl_util.hpp"

namespace fusion::net {

namespace {

using clock = std::chrono::steady_clock;

constexpr size_t welcome_size = preamble_size + 8;
// With read-ahead, one recv fills this much of OpenSSL's buffer: many records per system call.
constexpr size_t read_buffer_bytes = size_t{64} << 10;

// What the certificate check found wrong, in words a user can act on.
std::string verify_problem(long verify) {
  switch (verify) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return "its certificate was not issued by this cluster's CA";
    case X509_V_ERR_CERT_HAS_EXPIRED: return "its certificate has expired";
    case X509_V_ERR_CERT_NOT_YET_VALID: return "its certificate is not valid yet (are the clocks apart?)";
    default: return std::string("its certificate was refused: ") + X509_verify_cert_error_string(verify);
  }
}

// Why an SSL call that returned `rc` failed, as a sentence about the peer ("it ...").
std::string failure_text(SSL* ssl, int rc) {
  const int kind = SSL_get_error(ssl, rc);
  const int err = errno;
  const unsigned long code = ERR_peek_error();
  ERR_clear_error();
  if (kind == SSL_ERROR_ZERO_RETURN || (kind == SSL_ERROR_SYSCALL && code == 0 && err == 0))
    return "it closed the connection";
  if (kind == SSL_ERROR_SYSCALL && code == 0) return std::string("the connection failed: ") + std::strerror(err);
  switch (ERR_GET_REASON(code)) {
    case SSL_R_UNEXPECTED_EOF_WHILE_READING: return "it closed the connection";
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE: return "it presented no certificate";
    case SSL_R_CERTIFICATE_VERIFY_FAILED: return verify_problem(SSL_get_verify_result(ssl));
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH:
      return "it does not speak TLS (a node with security.mode=off, or not a FusionLLM data channel)";
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
      return "it does not speak TLS 1.3";
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      return "it requires a certificate, and this process presented none";
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
      return "it refused this process's certificate (both sides need certificates of the same cluster CA)";
    default: {
      const char* why = ERR_reason_error_string(code);
      return std::string("TLS error: ") + (why ? why : "unknown");
    }
  }
}

// Runs `op` (a handshake, read or write step on a non-blocking socket) until it succeeds, fails
// (`deadline_passed` when `deadline` passes). `op` returns 1 when done, `more` after progress
// short of done, else what the SSL call returned.
constexpr int more = 2;

template <class Op>
status drive(SSL* ssl, int fd, clock::time_point deadline, Op op) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int rc = op();
    if (rc == 1) return {};
    if (rc == more) continue;
    const int kind = SSL_get_error(ssl, rc);
    if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) {
      if (!poll_until(fd, kind == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) return fail(deadline_passed);
      continue;
    }
    return fail(failure_text(ssl, rc));
  }
}

// The role and name on the peer's certificate, checked against `rule`.
status check_peer(SSL* ssl, const peer_rule& rule) {
  const X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return fail("it presented no certificate");
  auto id = security::identity_of(cert);
  if (!id) return fail("its certificate names no holder: " + id.error());
  if (id->r != rule.role)
    return fail(std::string("its certificate is the ") + security::to_string(id->r) + " certificate of '" + id->name +
                "', and only a " + security::to_string(rule.role) + " may connect here");
  if (!rule.name.empty() && id->name != rule.name)
    return fail(std::string("it holds the certificate of ") + security::to_string(id->r) + " '" + id->name +
                "', not of '" + rule.name + "'");
  return {};
}

// The handshake and the welcome, both directions: the body of tls_accept and tls_connect.
result<stream> establish(int fd, const tls_context& ctx, const peer_rule& rule, clock::time_point deadline,
                         const std::string& peer, bool server) {
  const std::string where = std::string(server ? "TLS connection from " : "TLS connection to ") + peer + ": ";
  security::ssl_ptr ssl(SSL_new(ctx.native()));
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) {
    ERR_clear_error();
    return fail(where + "cannot set up a TLS session");
  }
  server ? SSL_set_accept_state(ssl.get()) : SSL_set_connect_state(ssl.get());
  if (auto st = set_nonblocking(fd, true); !st) return fail(where + st.error());
  auto refuse = [&](const std::string& why) {
    (void)set_nonblocking(fd, false);
    return fail(where + (why == deadline_passed ? "the TLS handshake did not finish in time" : why));
  };
  if (auto done = drive(ssl.get(), fd, deadline, [&] { return SSL_do_handshake(ssl.get()); }); !done)
    return refuse(done.error());
  if (auto fits = check_peer(ssl.get(), rule); !fits) return refuse(fits.error());
  // The welcome, written by the server and read by the client whole, against the deadline.
  std::byte welcome[welcome_size] = {};
  size_t moved = 0;
  auto transfer = [&](auto io) {
    return drive(ssl.get(), fd, deadline, [&] {
      size_t n = 0;
      const int rc = io(ssl.get(), welcome + moved, welcome_size - moved, &n);
      moved += n;
      return rc == 1 && moved < welcome_size ? more : rc;
    });
  };
  if (server) {
    encode_preamble({flag_ack, 8, 0}, welcome);
    if (auto sent = transfer(SSL_write_ex); !sent) return refuse(sent.error());
  } else {
    if (auto got = transfer(SSL_read_ex); !got) {
      // The server checks our certificate after our side of the handshake is done: a refusal
      // arrives here, as an alert or as the end of the connection.
      if (got.error() == "it closed the connection")
        return refuse("it closed the connection after the TLS handshake (it refused this process's certificate; its "
                      "log says why)");
      return refuse(got.error());
    }
    auto pre = decode_preamble(welcome);
    if (!pre || pre->flags != flag_ack || pre->meta_size != 8 || pre->payload_size != 0)
      return refuse("its first message is not a data channel welcome");
  }
  if (auto st = set_nonblocking(fd, false); !st) return fail(where + st.error());
  return stream(fd, ssl.release());
}

}  // namespace

result<std::shared_ptr<const tls_context>> tls_context::load(const security::identity_files& files) {
  // OpenSSL writes with write(2): a peer gone mid-record must give EPIPE, not kill the process.
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] { std::signal(SIGPIPE, SIG_IGN); });
  std::shared_ptr<tls_context> ctx(new tls_context());
  ctx->ctx_ = SSL_CTX_new(TLS_method());
  auto refuse = [](const std::string& what) {
    const unsigned long code = ERR_peek_error();
    ERR_clear_error();
    const char* why = code ? ERR_reason_error_string(code) : nullptr;
    return fail(what + (why ? std::string(" (") + why + ")" : std::string()));
  };
  SSL_CTX* c = ctx->ctx_;
  if (!c) return refuse("cannot create a TLS context");
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
  // AES-128-GCM first: with AES-NI it is the fastest suite here, and 128 bits suffice.
  SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  if (SSL_CTX_use_certificate_chain_file(c, files.certificate.c_str()) != 1)
    return refuse("cannot read the certificate " + files.certificate);
  if (SSL_CTX_use_PrivateKey_file(c, files.key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(c) != 1) {
    if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH)
      return refuse("the private key " + files.key + " does not belong to the certificate " + files.certificate);
    return refuse("cannot read the private key " + files.key);
  }
  if (SSL_CTX_load_verify_locations(c, files.ca.c_str(), nullptr) != 1)
    return refuse("cannot read the CA certificate " + files.ca);
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // Connections live as long as the run: no resumption, so no tickets to send or store.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // The frame layer finds truncation itself (every frame announces its length).
  SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read what the socket has, not a 5-byte header and then a record: half the system calls.
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, read_buffer_bytes);
  return std::shared_ptr<const tls_context>(std::move(ctx));
}

tls_context::~tls_context() {
  if (ctx_) SSL_CTX_free(ctx_);
}

result<stream> tls_accept(int fd, const tls_context& ctx, const peer_rule& rule, clock::time_point deadline,
                          const std::string& peer) {
  return establish(fd, ctx, rule, deadline, peer, true);
}

result<stream> tls_connect(int fd, const tls_context& ctx, const peer_rule& rule, clock::time_point deadline,
                           const std::string& peer) {
  return establish(fd, ctx, rule, deadline, peer, false);
}

result<std::string> peer_certificate_name(const stream& io) {
  if (!io.native()) return fail("the connection is not TLS, so it names no certificate holder");
  const X509* cert = SSL_get0_peer_certificate(io.native());
  if (!cert) return fail("it presented no certificate");
  auto id = security::identity_of(cert);
  if (!id) return fail("its certificate names no holder: " + id.error());
  return id->name;
}

status tls_handshake_check(int fd, const tls_context& ctx, clock::time_point deadline,
                           std::chrono::milliseconds settle) {
  security::ssl_ptr ssl(SSL_new(ctx.native()));
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) {
    ERR_clear_error();
    return fail("cannot set up a TLS session");
  }
  SSL_set_connect_state(ssl.get());
  if (auto st = set_nonblocking(fd, true); !st) return st;
  status outcome = drive(ssl.get(), fd, deadline, [&] { return SSL_do_handshake(ssl.get()); });
  if (outcome) {
    char byte = 0;
    size_t n = 0;
    // Silence until `settle` is fine: a server may wait for the client to speak first.
    outcome = drive(ssl.get(), fd, clock::now() + settle, [&] { return SSL_read_ex(ssl.get(), &byte, 1, &n); });
    if (!outcome && outcome.error() == deadline_passed) outcome = {};
    if (!outcome && outcome.error() == "it closed the connection")
      outcome = fail("it closed the connection after the TLS handshake (it refused this process's certificate)");
  } else if (outcome.error() == deadline_passed) {
    outcome = fail("the TLS handshake did not finish in time");
  }
  (void)set_nonblocking(fd, false);
  return outcome;
}

}  // namespace fusion::net
