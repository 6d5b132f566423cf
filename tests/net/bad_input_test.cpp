// Malformed traffic written with plain sockets: every bad frame is rejected, counted and
// reported, and the server keeps serving other connections. Also socket errors and the probe.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "net/frame_channel.hpp"
#include "net/link_probe.hpp"
#include "net_test_util.hpp"

using namespace fusion::net;
using namespace fusion::net::test;
using namespace std::chrono_literals;

namespace {

socket raw_connect(uint16_t port) {
  auto s = connect_tcp("127.0.0.1", port);
  REQUIRE_MESSAGE(s.ok(), s.error());
  return std::move(*s);
}

// True when the server closed the connection (recv sees EOF or a reset).
bool closed_by_server(socket& s) {
  char c;
  size_t got = 0;
  return !recv_all(s.fd(), &c, 1, &got).ok() && got == 0;
}

// A well-formed frame still goes through on a fresh connection.
void check_server_still_works(collecting_server& srv, size_t frames_before) {
  auto tx = frame_sender::connect("127.0.0.1", srv.port());
  REQUIRE(tx.ok());
  auto p = std::make_shared<std::vector<std::byte>>(pattern(4096, 11));
  (*tx)->send("after", p->data(), p->size(), p);
  REQUIRE(srv.wait_frames(frames_before + 1));
  CHECK(srv.frames().back().payload == *p);
}

struct bad_case {
  const char* name;
  void (*corrupt)(std::byte* pre);
  const char* expected;
};

}  // namespace

TEST_CASE("net bad preambles are rejected, counted and close only their connection") {
  const bad_case cases[] = {
      {"wrong magic", [](std::byte* p) { p[0] = std::byte{'X'}; }, "bad magic"},
      {"wrong version", [](std::byte* p) { p[4] = std::byte{99}; }, "protocol version 99"},
      {"meta too long", [](std::byte* p) { encode_preamble({0, max_meta_bytes + 1, 0}, p); }, "meta length 65537"},
      {"payload over the limit", [](std::byte* p) { encode_preamble({0, 0, max_payload_bytes + 1}, p); },
       "payload length 2147483649"},
      {"unknown flag", [](std::byte* p) { p[5] = std::byte{0x80}; }, "unknown preamble flags"},
  };
  collecting_server srv;
  size_t n = 0;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto s = raw_connect(srv.port());
    std::byte pre[preamble_size];
    encode_preamble({0, 0, 16}, pre);
    c.corrupt(pre);
    REQUIRE(send_all(s.fd(), pre, preamble_size).ok());
    ++n;
    REQUIRE(srv.wait_errors(n));
    auto e = srv.errors().back();
    CHECK(e.kind == channel_error_kind::bad_preamble);
    CHECK_MESSAGE(e.message.find(c.expected) != std::string::npos, e.message);
    CHECK(closed_by_server(s));
    auto stats = srv.server().stats();
    CHECK(stats.rejected == n);
    CHECK(stats.broken_connections == n);
  }
  check_server_still_works(srv, 0);
}

TEST_CASE("net connections beyond max_connections are closed at once and reported") {
  frame_server_options opts;
  opts.max_connections = 2;
  collecting_server srv(opts);
  auto a = raw_connect(srv.port());
  auto b = raw_connect(srv.port());
  auto c = raw_connect(srv.port());  // one too many: closed, the first two stay
  CHECK(closed_by_server(c));
  REQUIRE(srv.wait_errors(1));
  auto e = srv.errors().front();
  CHECK(e.kind == channel_error_kind::refused);
  CHECK_FALSE(e.established);
  CHECK_MESSAGE(e.message.find("2 connections are open") != std::string::npos, e.message);
  CHECK(srv.server().stats().turned_away == 1);
  // Once one of them leaves, a new connection is served again.
  a.close();
  b.close();
  std::this_thread::sleep_for(200ms);  // their readers see the ends and finish
  check_server_still_works(srv, 0);
}

TEST_CASE("net a connection that sends no frame in time is closed, even one trickling bytes") {
  frame_server_options opts;
  opts.first_frame_timeout = std::chrono::milliseconds(300);
  collecting_server srv(opts);
  auto silent = raw_connect(srv.port());
  auto trickle = raw_connect(srv.port());
  const auto t0 = std::chrono::steady_clock::now();
  std::byte pre[preamble_size];
  encode_preamble({0, 0, 0}, pre);
  // One byte every 100 ms: each read returns before any per-read timeout would fire, so only a
  // deadline for the whole preamble closes it.
  bool cut = false;
  for (size_t i = 0; i < preamble_size - 1 && !cut; ++i) {
    cut = !send_all(trickle.fd(), pre + i, 1).ok();
    std::this_thread::sleep_for(100ms);
  }
  CHECK(closed_by_server(silent));
  CHECK(closed_by_server(trickle));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  REQUIRE(srv.wait_errors(2));
  for (auto& e : srv.errors()) {
    CHECK_FALSE(e.established);
    CHECK_MESSAGE(e.message.find("sent no frame within 300 ms") != std::string::npos, e.message);
  }
  // A peer that sends its first frame in time is unaffected, and later idle time is fine.
  auto tx = frame_sender::connect("127.0.0.1", srv.port());
  REQUIRE(tx.ok());
  auto p = std::make_shared<std::vector<std::byte>>(pattern(64, 3));
  (*tx)->send("first", p->data(), p->size(), p);
  REQUIRE(srv.wait_frames(1));
  std::this_thread::sleep_for(600ms);
  (*tx)->send("after a pause", p->data(), p->size(), p);
  REQUIRE(srv.wait_frames(2));
  CHECK(srv.errors().size() == 2);
}

TEST_CASE("net a sender whose first frame comes after the first-frame deadline keeps its connection") {
  // As a link that only peer-held snapshots use: connected at wiring, its first tensor comes
  // snapshot-every steps later. The sender's greeting (an empty probe frame) is its first frame.
  frame_server_options opts;
  opts.first_frame_timeout = std::chrono::milliseconds(300);
  collecting_server srv(opts);
  auto tx = frame_sender::connect("127.0.0.1", srv.port());
  REQUIRE(tx.ok());
  std::this_thread::sleep_for(900ms);
  auto p = std::make_shared<std::vector<std::byte>>(pattern(4096, 5));
  status sent = fail("not completed");
  std::atomic<bool> done{false};
  REQUIRE((*tx)->send("late", p->data(), p->size(), p, [&](const status& s) {
    sent = s;
    done = true;
  }) == send_status::queued);
  REQUIRE(srv.wait_frames(1));
  CHECK(srv.frames().front().payload == *p);
  CHECK(eventually([&] { return done.load(); }));
  CHECK_MESSAGE(sent.ok(), sent.error());
  (*tx)->close();
  CHECK(srv.errors().empty());
  auto stats = srv.server().stats();
  CHECK(stats.broken_connections == 0);
  CHECK(stats.probe_frames == 1);  // the greeting, never shown to the handler
  CHECK(stats.frames == 1);
}

TEST_CASE("net a connection dropped mid-payload is counted as broken and reported") {
  collecting_server srv;
  {
    auto s = raw_connect(srv.port());
    std::byte pre[preamble_size];
    encode_preamble({0, 4, 1000}, pre);
    REQUIRE(send_all(s.fd(), pre, preamble_size).ok());
    REQUIRE(send_all(s.fd(), "meta", 4).ok());
    auto half = pattern(500, 1);
    REQUIRE(send_all(s.fd(), half.data(), half.size()).ok());
  }  // closed here, 500 bytes short
  REQUIRE(srv.wait_frames(1));
  CHECK(srv.frames()[0].error.find("after 500 of 1000 payload bytes") != std::string::npos);
  REQUIRE(srv.wait_errors(1));
  CHECK(srv.errors()[0].kind == channel_error_kind::truncated);
  CHECK(eventually([&] { return srv.server().stats().broken_connections == 1; }));
  {
    auto s = raw_connect(srv.port());  // and inside a preamble
    REQUIRE(send_all(s.fd(), "FLNK", 4).ok());
  }
  REQUIRE(srv.wait_errors(2));
  CHECK(srv.errors()[1].message.find("after 4 of 20 bytes") != std::string::npos);
  CHECK(srv.server().stats().frames == 0);
  check_server_still_works(srv, 1);
}

TEST_CASE("net a connection closed between frames is not an error") {
  collecting_server srv;
  {
    auto tx = frame_sender::connect("127.0.0.1", srv.port());
    REQUIRE(tx.ok());
    auto p = std::make_shared<std::vector<std::byte>>(pattern(100, 2));
    (*tx)->send("one", p->data(), p->size(), p);
    (*tx)->close();
  }
  REQUIRE(srv.wait_frames(1));
  CHECK(eventually([&] { return srv.server().stats().connections == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(srv.errors().empty());
  CHECK(srv.server().stats().broken_connections == 0);
}

TEST_CASE("net connecting to a closed port gives a clear error") {
  uint16_t port = 0;
  {
    auto l = listen_tcp("127.0.0.1", 0);
    REQUIRE(l.ok());
    port = l->local_port();
    CHECK(port != 0);
  }  // closed: nothing listens there now
  auto s = frame_sender::connect("127.0.0.1", port);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == "cannot connect to 127.0.0.1:" + std::to_string(port) + ": Connection refused");
  auto bad = connect_tcp("no-such-host.invalid", 80, std::chrono::milliseconds(500));
  CHECK(bad.error().find("cannot resolve no-such-host.invalid:80") == 0);
}

TEST_CASE("net endpoints are named with IPv6 hosts in brackets") {
  CHECK(endpoint_name("::1", 5) == "[::1]:5");
  CHECK(endpoint_name("10.77.0.12", 7701) == "10.77.0.12:7701");
}

TEST_CASE("net link probe on loopback measures a positive rate and latency") {
  collecting_server srv;
  probe_options opts;
  opts.duration = std::chrono::milliseconds(300);
  opts.warmup = std::chrono::milliseconds(100);
  auto r = probe_link("127.0.0.1", srv.port(), opts);
  REQUIRE_MESSAGE(r.ok(), r.error());
  CHECK(r->mbit_per_s > 100);
  CHECK(r->seconds >= 0.29);
  CHECK(r->rtt_ms > 0);
  CHECK(r->rtt_ms < 100);
  auto stats = srv.server().stats();
  CHECK(stats.frames == 0);  // probe frames never reach the handler
  CHECK(stats.probe_frames == r->frames + 3);
  CHECK(eventually([&] { return srv.errors().empty() && srv.server().stats().broken_connections == 0; }));
  auto down = probe_link("127.0.0.1", 1, opts);
  CHECK(down.error().find("cannot connect to 127.0.0.1:1") == 0);
}
