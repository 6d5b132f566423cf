// Frame channel over loopback: round trips, ordering, concurrency, refusal and shutdown.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "net/frame_channel.hpp"
#include "net_test_util.hpp"

using namespace fusion::net;
using namespace fusion::net::test;

namespace {

std::unique_ptr<frame_sender> connect_to(uint16_t port, frame_sender_options opts = {}) {
  auto s = frame_sender::connect("127.0.0.1", port, opts);
  REQUIRE_MESSAGE(s.ok(), s.error());
  return std::move(*s);
}

frame_sender_options queue_of(size_t frames) {
  frame_sender_options o;
  o.max_queued_frames = frames;
  return o;
}

}  // namespace

TEST_CASE("net preamble encodes the documented little-endian layout and round-trips") {
  std::byte buf[preamble_size];
  encode_preamble({flag_probe, 0x01020304, 0x0a0b0c0d0e}, buf);
  CHECK(std::memcmp(buf, "FLNK", 4) == 0);
  CHECK(std::to_integer<int>(buf[4]) == frame_version);
  CHECK(std::to_integer<int>(buf[5]) == flag_probe);
  CHECK(std::to_integer<int>(buf[8]) == 0x04);
  CHECK(std::to_integer<int>(buf[12]) == 0x0e);
  auto p = decode_preamble(buf, 0x02000000, uint64_t{1} << 40);
  REQUIRE(p.ok());
  CHECK(p->meta_size == 0x01020304u);
  CHECK(p->payload_size == 0x0a0b0c0d0eu);
  CHECK(decode_preamble(buf).error().find("meta length") != std::string::npos);
}

TEST_CASE("net frames of 0 B, 1 B, 4 MiB and 64 MiB arrive intact over loopback") {
  collecting_server srv;
  auto tx = connect_to(srv.port());
  std::vector<size_t> sizes = {0, 1, size_t{4} << 20, size_t{64} << 20};
  std::vector<std::shared_ptr<std::vector<std::byte>>> payloads;
  std::atomic<int> done_ok{0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto p = std::make_shared<std::vector<std::byte>>(pattern(sizes[i], static_cast<uint32_t>(i)));
    payloads.push_back(p);
    auto st = tx->send("frame-" + std::to_string(i), p->data(), p->size(), p,
                       [&](const status& sent) { done_ok += sent.ok(); });
    CHECK(st == send_status::queued);
  }
  REQUIRE(srv.wait_frames(sizes.size()));
  tx->close();
  CHECK(done_ok == 4);
  auto frames = srv.frames();
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK(frames[i].meta == "frame-" + std::to_string(i));
    CHECK(frames[i].error.empty());
    CHECK(frames[i].payload == *payloads[i]);
  }
  auto stats = srv.server().stats();
  CHECK(stats.frames == 4);
  CHECK(stats.bytes == (size_t{68} << 20) + 1);
  CHECK(stats.rejected == 0);
  CHECK(tx->bytes_sent() == stats.bytes);
}

TEST_CASE("net many small frames keep their order") {
  collecting_server srv;
  auto tx = connect_to(srv.port(), queue_of(8));
  constexpr int count = 2000;
  for (int i = 0; i < count; ++i) {
    auto p = std::make_shared<std::vector<std::byte>>(pattern(static_cast<size_t>(i % 97), static_cast<uint32_t>(i)));
    REQUIRE(tx->send(std::to_string(i), p->data(), p->size(), p) == send_status::queued);
  }
  tx->close();
  CHECK(tx->frames_sent() == count);
  REQUIRE(srv.wait_frames(count));
  auto frames = srv.frames();
  for (int i = 0; i < count; ++i) {
    REQUIRE(frames[static_cast<size_t>(i)].meta == std::to_string(i));
    CHECK(frames[static_cast<size_t>(i)].payload == pattern(static_cast<size_t>(i % 97), static_cast<uint32_t>(i)));
  }
}

TEST_CASE("net several concurrent senders each keep their order") {
  collecting_server srv;
  constexpr int senders = 4, per_sender = 100;
  std::vector<std::thread> threads;
  for (int s = 0; s < senders; ++s) {
    threads.emplace_back([&, s] {
      auto tx = connect_to(srv.port());
      for (int i = 0; i < per_sender; ++i) {
        auto p = std::make_shared<std::vector<std::byte>>(pattern(64 << 10, static_cast<uint32_t>(s * 1000 + i)));
        tx->send(std::to_string(s) + ":" + std::to_string(i), p->data(), p->size(), p);
      }
      tx->close();
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(srv.wait_frames(senders * per_sender));
  std::vector<int> next(senders, 0);
  for (auto& f : srv.frames()) {
    auto colon = f.meta.find(':');
    int s = std::stoi(f.meta.substr(0, colon)), i = std::stoi(f.meta.substr(colon + 1));
    CHECK(i == next[static_cast<size_t>(s)]++);
    CHECK(f.payload == pattern(64 << 10, static_cast<uint32_t>(s * 1000 + i)));
  }
  CHECK(srv.server().stats().connections == senders);
}

TEST_CASE("net a refused frame is counted and later frames still arrive") {
  collecting_server srv;
  auto p = std::make_shared<std::vector<std::byte>>(pattern(1 << 20, 7));
  auto tx = connect_to(srv.port());
  tx->send("refuse", p->data(), p->size(), p);
  tx->send("same connection", p->data(), 10, p);
  REQUIRE(srv.wait_frames(1));
  auto tx2 = connect_to(srv.port());
  tx2->send("other connection", p->data(), p->size(), p);
  REQUIRE(srv.wait_frames(2));
  auto frames = srv.frames();
  CHECK(frames[0].meta == "same connection");
  CHECK(frames[1].meta == "other connection");
  CHECK(frames[1].payload == *p);
  auto stats = srv.server().stats();
  CHECK(stats.rejected == 1);
  CHECK(stats.broken_connections == 0);
  REQUIRE(srv.errors().size() == 1);
  CHECK(srv.errors()[0].kind == channel_error_kind::refused);
  CHECK(srv.errors()[0].message.find("refused: test refuses this frame") != std::string::npos);
}

TEST_CASE("net try_send reports a full queue when the peer does not read") {
  auto listener = listen_tcp("127.0.0.1", 0);
  REQUIRE(listener.ok());
  auto tx = connect_to(listener->local_port(), queue_of(2));
  auto idle = accept_tcp(*listener);  // accepted, never read: the writer blocks in sendmsg
  REQUIRE(idle.ok());
  auto big = std::make_shared<std::vector<std::byte>>(size_t{64} << 20);
  std::atomic<int> aborted{0};
  auto count_abort = [&](const status& sent) { aborted += sent.error().find("aborted") != std::string::npos; };
  send_status st = send_status::queued;
  int queued = 0;
  while (queued < 100 && (st = tx->try_send("", big->data(), big->size(), big, count_abort)) == send_status::queued)
    ++queued;
  CHECK(st == send_status::queue_full);
  CHECK(queued <= 3);  // one with the writer plus max_queued_frames
  tx->abort();         // must not hang on the blocked writer
  CHECK(aborted == queued);
  CHECK(tx->send("", big->data(), 1, big) == send_status::closed);
}

TEST_CASE("net server stop during a transfer completes the frame with an error and does not hang") {
  collecting_server srv;
  auto raw = connect_tcp("127.0.0.1", srv.port());
  REQUIRE(raw.ok());
  std::byte pre[preamble_size];
  encode_preamble({0, 0, 1 << 20}, pre);
  REQUIRE(send_all(raw->fd(), pre, preamble_size).ok());
  auto half = pattern(1 << 19, 3);
  REQUIRE(send_all(raw->fd(), half.data(), half.size()).ok());
  REQUIRE(srv.wait_started(1));
  auto t0 = std::chrono::steady_clock::now();
  srv.server().stop();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  REQUIRE(srv.wait_frames(1));
  CHECK(srv.frames()[0].error.find("stopped") != std::string::npos);
  CHECK(srv.server().stats().broken_connections == 0);  // our own stop is not the peer's fault
  srv.server().stop();                                   // idempotent
}

TEST_CASE("net sender and server shut down while 64 MiB frames are in flight") {
  auto srv = std::make_unique<collecting_server>();
  auto tx = connect_to(srv->port());
  auto big = std::make_shared<std::vector<std::byte>>(size_t{64} << 20);
  std::atomic<int> completions{0};
  for (int i = 0; i < 4; ++i) tx->send("big", big->data(), big->size(), big, [&](const status&) { ++completions; });
  REQUIRE(srv->wait_started(1));
  srv.reset();  // destructor stops the server mid-stream
  tx->close(std::chrono::seconds(5));
  CHECK(completions == 4);  // every frame completed, successfully or with an error
}
