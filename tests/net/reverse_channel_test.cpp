// Connection reversal on the data channel (docs/transport.md, "Connection reversal"): a node
// that accepts no inbound connection dials the sender's frame_server, says a reverse hello, and
// then reads the sender's frames on that connection with a frame_server that listens nowhere.
// In plaintext and through TLS; a reverse hello from the wrong certificate, with an unexpected
// token, or to a server that takes none is refused on both sides with a reason.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "net/frame_channel.hpp"
#include "net/tls.hpp"
#include "net_test_util.hpp"
#include "security/certs.hpp"
#include "tests/support/certs_fixture.hpp"

using namespace fusion;
using namespace fusion::net;
using namespace fusion::net::test;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const tls_context> node_tls(const std::string& node) {
  auto ctx = tls_context::load(security::files_in(fusion::test::certs_dir(), security::role::node, node));
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  return *ctx;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The sending node's side: a frame_server that takes reverse hellos from the nodes it expects
// (with their tokens), checks that a TLS certificate names the node the hello names, and keeps
// the adopted connection as a frame_sender.
class reversing_server {
 public:
  explicit reversing_server(std::shared_ptr<const tls_context> tls = nullptr, bool take_reversed = true) {
    frame_server_options o;
    o.tls = std::move(tls);
    o.peer = {security::role::node, {}};
    if (take_reversed) {
      o.accept_reverse = [this](const reverse_hello& h) -> status {
        std::lock_guard lock(mutex_);
        if (!expected_.count(h.meta.node + "/" + h.meta.token))
          return fail("no reverse connection from node '" + h.meta.node + "' with that token was asked for");
        if (o_tls_ && h.certificate_name != h.meta.node)
          return fail("it says it is node '" + h.meta.node + "' but holds the certificate of '" + h.certificate_name +
                      "'");
        return {};
      };
      o.adopt_reverse = [this](const reverse_hello& h, socket sock, stream io) {
        std::lock_guard lock(mutex_);
        sender_ = frame_sender::adopt(std::move(sock), std::move(io), h.peer);
      };
    }
    o_tls_ = o.tls != nullptr;
    srv_ = std::make_unique<collecting_server>(std::move(o));
  }

  void expect(const std::string& node, const std::string& token) {
    std::lock_guard lock(mutex_);
    expected_.insert(node + "/" + token);
  }
  uint16_t port() const { return srv_->port(); }
  collecting_server& server() { return *srv_; }
  frame_sender* sender() {
    std::lock_guard lock(mutex_);
    return sender_.get();
  }

 private:
  std::mutex mutex_;
  std::set<std::string> expected_;
  bool o_tls_ = false;
  std::unique_ptr<frame_sender> sender_;
  std::unique_ptr<collecting_server> srv_;
};

// The firewalled node's reader: listens nowhere, reads what it is handed.
frame_server_options unbound(std::shared_ptr<const tls_context> tls = nullptr) {
  frame_server_options o;
  o.listen = false;
  o.tls = std::move(tls);
  return o;
}

// Sends frames of several sizes (empty, small, 1 MiB) over the adopted sender and checks that
// the firewalled side's reader got them intact and in order.
void frames_arrive(frame_sender& tx, collecting_server& rx) {
  const std::vector<size_t> sizes = {0, 7, 4096, size_t{1} << 20};
  std::vector<std::shared_ptr<std::vector<std::byte>>> payloads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    payloads.push_back(std::make_shared<std::vector<std::byte>>(pattern(sizes[i], static_cast<uint32_t>(i))));
    REQUIRE(tx.send("frame " + std::to_string(i), payloads.back()->data(), sizes[i], payloads.back()) ==
            send_status::queued);
  }
  REQUIRE(rx.wait_frames(sizes.size()));
  auto got = rx.frames();
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK(got[i].meta == "frame " + std::to_string(i));
    CHECK(got[i].error.empty());
    CHECK(got[i].payload == *payloads[i]);
  }
}

}  // namespace

TEST_CASE("net reverse the reverse hello's meta round-trips and bad ones say what is wrong") {
  auto meta = encode_reverse_hello({"b1", "0123abcd"});
  auto back = decode_reverse_hello(meta);
  REQUIRE(back.ok());
  CHECK(back->node == "b1");
  CHECK(back->token == "0123abcd");
  CHECK(contains(decode_reverse_hello("").error(), "ends before its node name"));
  CHECK(contains(decode_reverse_hello(std::string("\0", 1)).error(), "empty node name"));
  CHECK(contains(decode_reverse_hello("\x05" "ab").error(), "cut off"));
  CHECK(contains(decode_reverse_hello("\x02" "b1").error(), "ends before its token"));
  CHECK(contains(decode_reverse_hello(meta + "x").error(), "stray bytes"));

  std::byte raw[preamble_size];
  encode_preamble({flag_reverse, static_cast<uint32_t>(meta.size()), 0}, raw);
  CHECK(decode_preamble(raw).ok());
  encode_preamble({flag_reverse, 10, 5}, raw);
  CHECK(contains(decode_preamble(raw).error(), "reverse hello with a payload"));
  encode_preamble({flag_reverse | flag_ack_request, 10, 0}, raw);
  CHECK(contains(decode_preamble(raw).error(), "reverse hello with other flags"));
  encode_preamble({flag_reverse, max_reverse_meta + 1, 0}, raw);
  CHECK(contains(decode_preamble(raw).error(), "bytes of meta"));
  encode_preamble({16, 0, 0}, raw);
  CHECK(contains(decode_preamble(raw).error(), "unknown preamble flags"));
}

TEST_CASE("net reverse a reversed plaintext connection carries the sender's frames to a server that listens nowhere") {
  reversing_server x;
  x.expect("f1", "tok");
  collecting_server f(unbound());
  CHECK(f.port() == 0);
  auto conn = dial_reverse("127.0.0.1", x.port(), {"f1", "tok"});
  REQUIRE_MESSAGE(conn.ok(), conn.error());
  REQUIRE(f.server().adopt(std::move(conn->sock), std::move(conn->io), conn->peer).ok());
  REQUIRE(eventually([&] { return x.sender() != nullptr; }));
  frames_arrive(*x.sender(), f);
  CHECK(x.server().server().stats().reversed == 1);
  CHECK(x.server().server().stats().frames == 0);  // the connection left x's reader
  auto fs = f.server().stats();
  CHECK(fs.connections == 0);  // nothing was ever accepted: the firewalled side was never dialed
  CHECK(fs.adopted == 1);
  CHECK(fs.frames == 4);
  // The sender closing its end is the normal end of the reversed connection.
  x.sender()->close(2s);
  CHECK(f.errors().empty());
}

TEST_CASE("net reverse a reversed TLS connection carries frames, each side checking the other's certificate") {
  reversing_server x(node_tls("n0"));
  x.expect("n1", "tok");
  collecting_server f(unbound(node_tls("n1")));
  reverse_options o;
  o.tls = node_tls("n1");
  o.peer = {security::role::node, "n0"};
  auto conn = dial_reverse("127.0.0.1", x.port(), {"n1", "tok"}, o);
  REQUIRE_MESSAGE(conn.ok(), conn.error());
  CHECK(conn->io.secure());
  REQUIRE(f.server().adopt(std::move(conn->sock), std::move(conn->io), conn->peer).ok());
  REQUIRE(eventually([&] { return x.sender() != nullptr; }));
  frames_arrive(*x.sender(), f);
  CHECK(x.server().server().stats().reversed == 1);
}

TEST_CASE("net reverse a reverse hello from another node's certificate is refused on both sides") {
  reversing_server x(node_tls("n0"));
  x.expect("n1", "tok");
  reverse_options o;
  o.tls = node_tls("n2");  // holds n2's certificate, says it is n1
  o.peer = {security::role::node, "n0"};
  auto conn = dial_reverse("127.0.0.1", x.port(), {"n1", "tok"}, o);
  REQUIRE_FALSE(conn.ok());
  CHECK(contains(conn.error(), "refused the reverse hello"));
  REQUIRE(x.server().wait_errors(1));
  auto err = x.server().errors().front();
  CHECK(err.kind == channel_error_kind::refused);
  CHECK_FALSE(err.established);  // a stranger's: the run goes on
  CHECK(contains(err.message, "holds the certificate of 'n2'"));
  CHECK(x.sender() == nullptr);
  CHECK(x.server().server().stats().reversed == 0);
}

TEST_CASE("net reverse the dialing node refuses a server holding another node's certificate") {
  reversing_server x(node_tls("n3"));
  x.expect("n1", "tok");
  reverse_options o;
  o.tls = node_tls("n1");
  o.peer = {security::role::node, "n0"};  // meant to reach n0
  auto conn = dial_reverse("127.0.0.1", x.port(), {"n1", "tok"}, o);
  REQUIRE_FALSE(conn.ok());
  CHECK(contains(conn.error(), "reverse connection to 127.0.0.1:"));
  CHECK(contains(conn.error(), "not of 'n0'"));
  CHECK(x.sender() == nullptr);
}

TEST_CASE("net reverse unasked, unexpected and late reverse hellos are refused") {
  SUBCASE("a wrong token") {
    reversing_server x;
    x.expect("f1", "tok");
    auto conn = dial_reverse("127.0.0.1", x.port(), {"f1", "guess"});
    REQUIRE_FALSE(conn.ok());
    REQUIRE(x.server().wait_errors(1));
    CHECK(contains(x.server().errors().front().message, "was asked for"));
  }
  SUBCASE("a server that takes no reversed connections") {
    reversing_server x(nullptr, false);
    auto conn = dial_reverse("127.0.0.1", x.port(), {"f1", "tok"});
    REQUIRE_FALSE(conn.ok());
    CHECK(contains(conn.error(), "refused the reverse hello"));
    REQUIRE(x.server().wait_errors(1));
    CHECK(contains(x.server().errors().front().message, "takes no reversed connections"));
  }
  SUBCASE("a reverse hello after a frame") {
    reversing_server x;
    x.expect("f1", "tok");
    auto sock = connect_tcp("127.0.0.1", x.port());
    REQUIRE(sock.ok());
    std::byte first[preamble_size];
    encode_preamble({0, 0, 0}, first);
    REQUIRE(send_all(sock->fd(), first, sizeof first).ok());
    auto meta = encode_reverse_hello({"f1", "tok"});
    std::string hello(preamble_size, '\0');
    encode_preamble({flag_reverse, static_cast<uint32_t>(meta.size()), 0}, reinterpret_cast<std::byte*>(hello.data()));
    hello += meta;
    REQUIRE(send_all(sock->fd(), hello.data(), hello.size()).ok());
    REQUIRE(x.server().wait_errors(1));
    auto err = x.server().errors().front();
    CHECK(err.kind == channel_error_kind::bad_preamble);
    CHECK(contains(err.message, "after the first frame"));
    CHECK(x.sender() == nullptr);
  }
}

TEST_CASE("net reverse a stopped reader ends the reversed connection, and the sender fails its frames") {
  reversing_server x;
  x.expect("f1", "tok");
  auto f = std::make_unique<collecting_server>(unbound());
  auto conn = dial_reverse("127.0.0.1", x.port(), {"f1", "tok"});
  REQUIRE(conn.ok());
  REQUIRE(f->server().adopt(std::move(conn->sock), std::move(conn->io), conn->peer).ok());
  REQUIRE(eventually([&] { return x.sender() != nullptr; }));
  f.reset();  // stop(): the adopted connection is cut and its thread joined
  auto big = std::make_shared<std::vector<std::byte>>(size_t{8} << 20);
  std::string error;
  std::mutex m;
  for (int i = 0; i < 20 && x.sender()->error().empty(); ++i) {
    x.sender()->send("x", big->data(), big->size(), big, [&](const status& s) {
      std::lock_guard lock(m);
      if (!s) error = s.error();
    });
    std::this_thread::sleep_for(20ms);
  }
  CHECK(eventually([&] { return !x.sender()->error().empty(); }));
}
