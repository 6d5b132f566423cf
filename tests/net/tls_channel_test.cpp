// The data channel over TLS 1.3: frames, acks and the link probe go through, and every kind of
// peer that must not get in is refused on both sides with a message saying why: no TLS, no
// certificate, a certificate of another CA, the admin's certificate, another node than meant,
// and a peer that stalls the handshake.
#include <doctest/doctest.h>
#include <openssl/ssl.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "net/frame_channel.hpp"
#include "net/link_probe.hpp"
#include "net/tls.hpp"
#include "net_test_util.hpp"
#include "security/certs.hpp"
#include "tests/support/certs_fixture.hpp"

using namespace fusion;
using namespace fusion::net;
using namespace fusion::net::test;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const tls_context> context_of(const std::string& dir, security::role r, const std::string& node = {}) {
  auto ctx = tls_context::load(security::files_in(dir, r, node));
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  return *ctx;
}

std::shared_ptr<const tls_context> node_context(const std::string& node) {
  return context_of(fusion::test::certs_dir(), security::role::node, node);
}

// A TLS data channel server of node n0 that accepts any node of the run.
frame_server_options tls_server_options() {
  frame_server_options o;
  o.tls = node_context("n0");
  o.peer = {security::role::node, {}};
  return o;
}

frame_sender_options tls_sender_options(const std::string& me, const std::string& expect = "n0") {
  frame_sender_options o;
  o.tls = node_context(me);
  o.peer = {security::role::node, expect};
  o.connect_timeout = 5000ms;
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The one error the server reported, once it has.
std::string server_error(collecting_server& srv) {
  REQUIRE(srv.wait_errors(1));
  return srv.errors().front().message;
}

}  // namespace

TEST_CASE("net tls frames of every size arrive intact") {
  collecting_server srv(tls_server_options());
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1"));
  REQUIRE_MESSAGE(tx.ok(), tx.error());
  // Small frames are gathered into records, large payloads are encrypted in place.
  const size_t sizes[] = {0, 1, 20, 4096, 16 << 10, (16 << 10) + 1, 1 << 20, (5 << 20) + 3};
  std::vector<std::shared_ptr<std::vector<std::byte>>> sent;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    auto p = std::make_shared<std::vector<std::byte>>(pattern(sizes[i], static_cast<uint32_t>(i)));
    sent.push_back(p);
    REQUIRE((*tx)->send("frame " + std::to_string(i), p->data(), p->size(), p) == send_status::queued);
  }
  REQUIRE(srv.wait_frames(std::size(sizes)));
  auto got = srv.frames();
  for (size_t i = 0; i < std::size(sizes); ++i) {
    CHECK(got[i].meta == "frame " + std::to_string(i));
    CHECK(got[i].error.empty());
    CHECK(got[i].payload == *sent[i]);
  }
  (*tx)->close();
  CHECK(srv.server().stats().tls_refused == 0);
  // The sender's close_notify is an orderly end: no error is reported.
  std::this_thread::sleep_for(100ms);
  CHECK(srv.errors().empty());
}

TEST_CASE("net tls the link probe measures a TLS link") {
  collecting_server srv(tls_server_options());
  probe_options o;
  o.warmup = 50ms;
  o.duration = 200ms;
  o.frame_bytes = 64 << 10;
  o.tls = node_context("n2");
  o.peer = {security::role::node, "n0"};
  auto r = probe_link("127.0.0.1", srv.port(), o);
  REQUIRE_MESSAGE(r.ok(), r.error());
  CHECK(r->mbit_per_s > 0);
  CHECK(r->rtt_ms > 0);
  CHECK(r->frames > 0);
  CHECK(srv.server().stats().probe_frames >= r->frames);
}

TEST_CASE("net tls close after abort leaves alone the descriptor number the aborted connection had") {
  // A node aborts its link to a lost peer; the link's last owner closes it later. That close
  // used to send a TLS close_notify (and set O_NONBLOCK) on the old descriptor number, which a
  // new connection may own by then: a cut link broke the survivors' next connection that way.
  collecting_server srv(tls_server_options());
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1"));
  REQUIRE_MESSAGE(tx.ok(), tx.error());
  (*tx)->abort();
  std::this_thread::sleep_for(100ms);
  // The freed number is among the lowest free ones: these pipes take it.
  std::vector<int> fds;
  for (int i = 0; i < 16; ++i) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    fds.insert(fds.end(), {p[0], p[1]});
  }
  (*tx)->close();
  for (int fd : fds) CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  for (size_t i = 0; i < fds.size(); i += 2) {
    REQUIRE(::fcntl(fds[i], F_SETFL, O_NONBLOCK) == 0);
    char c;
    CHECK(::read(fds[i], &c, 1) < 0);  // nothing was written into it
  }
  for (int fd : fds) ::close(fd);
}

TEST_CASE("net tls a plaintext sender is refused by a TLS server, and the server goes on") {
  collecting_server srv(tls_server_options());
  auto plain = frame_sender::connect("127.0.0.1", srv.port());
  REQUIRE(plain.ok());
  auto p = std::make_shared<std::vector<std::byte>>(pattern(64, 1));
  (*plain)->send("plain", p->data(), p->size(), p);
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "does not speak TLS"), why);
  CHECK(contains(why, "TLS connection from 127.0.0.1:"));
  CHECK_FALSE(srv.errors().front().established);
  CHECK(srv.server().stats().tls_refused == 1);
  CHECK(srv.frames().empty());
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1"));
  REQUIRE_MESSAGE(tx.ok(), tx.error());
  (*tx)->send("after", p->data(), p->size(), p);
  REQUIRE(srv.wait_frames(1));
}

TEST_CASE("net tls a TLS sender cannot connect to a plaintext server") {
  collecting_server srv;
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1"));
  REQUIRE_FALSE(tx.ok());
  CHECK_MESSAGE(contains(tx.error(), "TLS connection to 127.0.0.1:"), tx.error());
  CHECK_MESSAGE(contains(tx.error(), "closed the connection"), tx.error());
}

TEST_CASE("net tls a certificate of another CA is refused on both sides") {
  auto other = fusion::test::temp_path("certs-other", "dir");
  std::filesystem::remove_all(other);
  security::make_cluster_certs(other, {"n1"});
  collecting_server srv(tls_server_options());
  auto o = tls_sender_options("n1");
  o.tls = context_of(other, security::role::node, "n1");
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), o);
  REQUIRE_FALSE(tx.ok());
  // The client checks the server first: the server's certificate is not of the client's CA.
  CHECK_MESSAGE(contains(tx.error(), "not issued by this cluster's CA"), tx.error());
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "TLS connection from"), why);
  CHECK(srv.server().stats().tls_refused == 1);
  std::filesystem::remove_all(other);
}

TEST_CASE("net tls a client without a certificate is refused") {
  collecting_server srv(tls_server_options());
  auto sock = connect_tcp("127.0.0.1", srv.port());
  REQUIRE(sock.ok());
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
  SSL_set_fd(ssl.get(), sock->fd());
  // TLS 1.3: the client's handshake ends before the server has checked it; the refusal comes
  // as an alert on the first read.
  SSL_connect(ssl.get());
  char c;
  CHECK(SSL_read(ssl.get(), &c, 1) <= 0);
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "it presented no certificate"), why);
}

TEST_CASE("net tls the admin's certificate cannot send on the data channel") {
  collecting_server srv(tls_server_options());
  auto o = tls_sender_options("n1");
  o.tls = context_of(fusion::test::certs_dir(), security::role::admin);
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), o);
  REQUIRE_FALSE(tx.ok());
  CHECK_MESSAGE(contains(tx.error(), "refused this process's certificate"), tx.error());
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "admin certificate of 'admin', and only a node may connect here"), why);
}

TEST_CASE("net tls a sender refuses a server that holds another node's certificate") {
  collecting_server srv(tls_server_options());
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1", "n2"));
  REQUIRE_FALSE(tx.ok());
  CHECK_MESSAGE(contains(tx.error(), "it holds the certificate of node 'n0', not of 'n2'"), tx.error());
  CHECK(srv.frames().empty());
}

TEST_CASE("net tls a peer that stalls the handshake is closed at the deadline") {
  auto opts = tls_server_options();
  opts.first_frame_timeout = 300ms;
  collecting_server srv(opts);
  auto sock = connect_tcp("127.0.0.1", srv.port());
  REQUIRE(sock.ok());
  REQUIRE(send_all(sock->fd(), "\x16\x03", 2).ok());  // the start of a record, then nothing
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "the TLS handshake did not finish in time"), why);
  CHECK(srv.server().stats().tls_refused == 1);
}

TEST_CASE("net tls a peer that stops inside a record is waited for without spinning, then closed") {
  auto opts = tls_server_options();
  opts.first_frame_timeout = 500ms;
  collecting_server srv(opts);
  auto sock = connect_tcp("127.0.0.1", srv.port());
  REQUIRE(sock.ok());
  auto io = tls_connect(sock->fd(), *node_context("n1"), {security::role::node, "n0"},
                        std::chrono::steady_clock::now() + 5s, "the test server");
  REQUIRE_MESSAGE(io.ok(), io.error());
  auto cpu_seconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  const double before = cpu_seconds();
  // The header of a 64-byte application record, and 3 of its bytes.
  REQUIRE(send_all(sock->fd(), "\x17\x03\x03\x00\x40" "abc", 8).ok());
  auto why = server_error(srv);
  CHECK_MESSAGE(contains(why, "sent no frame within 500 ms"), why);
  // A reader that polled in a loop on the bytes TLS holds would burn the whole 500 ms.
  CHECK(cpu_seconds() - before < 0.25);
}

TEST_CASE("net tls a sender idle past the first-frame deadline after the handshake keeps its connection") {
  auto opts = tls_server_options();
  opts.first_frame_timeout = 400ms;
  collecting_server srv(opts);
  auto tx = frame_sender::connect("127.0.0.1", srv.port(), tls_sender_options("n1"));
  REQUIRE_MESSAGE(tx.ok(), tx.error());
  std::this_thread::sleep_for(1200ms);
  auto p = std::make_shared<std::vector<std::byte>>(pattern(1 << 16, 9));
  REQUIRE((*tx)->send("late", p->data(), p->size(), p) == send_status::queued);
  REQUIRE(srv.wait_frames(1));
  CHECK(srv.frames().front().payload == *p);
  (*tx)->close();
  CHECK((*tx)->error().empty());
  CHECK(srv.errors().empty());
  CHECK(srv.server().stats().broken_connections == 0);
}

TEST_CASE("net tls contexts name the file that cannot be used") {
  auto files = security::files_in(fusion::test::certs_dir(), security::role::node, "n1");
  auto missing = files;
  missing.certificate = "/nonexistent/n1.pem";
  auto r = tls_context::load(missing);
  REQUIRE_FALSE(r.ok());
  CHECK_MESSAGE(contains(r.error(), "cannot read the certificate /nonexistent/n1.pem"), r.error());
  auto mixed = files;
  mixed.key = security::files_in(fusion::test::certs_dir(), security::role::node, "n2").key;
  r = tls_context::load(mixed);
  REQUIRE_FALSE(r.ok());
  CHECK_MESSAGE(contains(r.error(), "does not belong to the certificate"), r.error());
}
