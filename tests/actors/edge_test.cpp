// The sending end of a cross-process edge, driven directly: it splits tensors into chunks no
// larger than the configured size, never has more than `window` chunks unacknowledged, resumes
// on credits, and reports each tensor it completed.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <thread>

#include "actors/edge_actor.hpp"
#include "actors/messages.hpp"
#include "compression/topk.hpp"
#include "core/wire.hpp"

using namespace fusion;
using namespace std::chrono_literals;

TEST_CASE("edge: at most `window` chunks are in flight until credits come back") {
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto me = caf::actor_cast<node_inbox>(self);
  // The test plays the receiving node (gets the chunks) and the reporting node (gets stats).
  edge_config ec{2, 1024};
  auto edge = spawn_edge_sender(sys, 5, me, ec, me);
  // Three tensors of 4 KiB: 4 chunks each, 12 chunks in all.
  for (uint32_t mb = 0; mb < 3; ++mb) {
    tensor t(shape_t{32, 32}, dtype::f32);
    t.fill(static_cast<float>(mb));
    self->send(edge, forward_atom::value, uint64_t{9}, mb, uint32_t{1}, uint8_t{0}, std::move(t));
  }
  std::vector<wire_header> got;
  auto take_chunks = [&](size_t expect) {
    for (size_t i = 0; i < expect; ++i)
      self->receive(
          [&](wire_atom, const wire_chunk& c) {
            auto h = decode_wire_header(c.header, c.size());
            REQUIRE(h.ok());
            CHECK(h->chunk_bytes <= ec.chunk_bytes);
            got.push_back(*h);
          },
          caf::after(5s) >> [&] { FAIL("expected a chunk"); });
    // No more than that while no credit is given.
    bool extra = false;
    self->receive([&](wire_atom, const wire_chunk&) { extra = true; }, caf::after(100ms) >> [] {});
    CHECK_FALSE(extra);
  };
  take_chunks(2);
  int reports = 0;
  uint64_t reported_bytes = 0;
  for (int round = 0; round < 5; ++round) {
    self->send(edge, credit_atom::value, uint64_t{5}, uint32_t{2});
    take_chunks(2);
  }
  REQUIRE(got.size() == 12);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].edge == 5);
    CHECK(got[i].step == 9);
    CHECK(got[i].micro_batch == i / 4);  // in order: micro-batch by micro-batch
    CHECK(got[i].offset == (i % 4) * 1024);
    CHECK(got[i].slot == 1);
  }
  // The last two credits complete the third tensor; every completion is reported.
  self->send(edge, credit_atom::value, uint64_t{5}, uint32_t{2});
  for (int i = 0; i < 3; ++i)
    self->receive(
        [&](stats_atom, const edge_stat& s) {
          ++reports;
          reported_bytes += s.bytes;
          CHECK(s.edge == 5);
          CHECK(s.tensors == 1);
          CHECK(s.seconds >= 0);
        },
        caf::after(5s) >> [] {});
  CHECK(reports == 3);
  CHECK(reported_bytes == 3 * 4096);
  self->send_exit(edge, caf::exit_reason::user_shutdown);
}

TEST_CASE("edge: tensors queued behind each other count the link's time once") {
  // The estimator learns a link's rate from these seconds and models the FIFO queueing of
  // back-to-back micro-batches itself: a tensor's time must not include the ones ahead of it.
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto me = caf::actor_cast<node_inbox>(self);
  auto edge = spawn_edge_sender(sys, 7, me, edge_config{8, 1 << 20}, me);
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t mb = 0; mb < 3; ++mb)
    self->send(edge, forward_atom::value, uint64_t{1}, mb, uint32_t{0}, uint8_t{0}, tensor(shape_t{8, 8}, dtype::f32));
  for (int i = 0; i < 3; ++i)
    self->receive([](wire_atom, const wire_chunk&) {}, caf::after(5s) >> [] { FAIL("expected a chunk"); });
  // All three wait on the wire together, then are acknowledged at once.
  std::this_thread::sleep_for(300ms);
  self->send(edge, credit_atom::value, uint64_t{7}, uint32_t{3});
  double summed = 0;
  std::vector<uint64_t> idle;
  for (int i = 0; i < 3; ++i)
    self->receive([&](stats_atom, const edge_stat& s) { summed += s.seconds, idle.push_back(s.idle_starts); },
                  caf::after(5s) >> [] { FAIL("expected a report"); });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Timed from each tensor's own first chunk, the three would sum to three times the wait.
  CHECK(summed >= 0.29);
  CHECK(summed <= wall);
  // Only the first found the edge idle, so only its time holds a round trip for the estimator
  // to take off (workload_estimator::observe_transfer).
  CHECK(idle == std::vector<uint64_t>{1, 0, 0});
  // A tensor sent after the last one was acknowledged starts on an idle edge again.
  self->send(edge, forward_atom::value, uint64_t{1}, uint32_t{3}, uint32_t{0}, uint8_t{0}, tensor(shape_t{8, 8}, dtype::f32));
  self->receive([](wire_atom, const wire_chunk&) {}, caf::after(5s) >> [] { FAIL("expected a chunk"); });
  self->send(edge, credit_atom::value, uint64_t{7}, uint32_t{1});
  self->receive([&](stats_atom, const edge_stat& s) { CHECK(s.idle_starts == 1); },
                caf::after(5s) >> [] { FAIL("expected a report"); });
  self->send_exit(edge, caf::exit_reason::user_shutdown);
}

TEST_CASE("edge: a compressed edge sends topk payloads, and compress_atom switches the codec") {
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto me = caf::actor_cast<node_inbox>(self);
  codec_settings codec;
  codec.kind = codec_kind::adatopk;
  codec.keep_ratio = 0.1;
  auto edge = spawn_edge_sender(sys, 6, me, edge_config{8, 1 << 20}, me, nullptr, codec);
  auto send_tensor = [&](uint32_t mb) {
    tensor t(shape_t{64, 64}, dtype::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>((i * 7919) % 1000) - 500.0f;
    self->send(edge, forward_atom::value, uint64_t{1}, mb, uint32_t{0}, uint8_t{0}, std::move(t));
  };
  auto take = [&](wire_header& h, std::vector<std::byte>& bytes) {
    self->receive(
        [&](wire_atom, const wire_chunk& c) {
          auto decoded = decode_wire_header(c.header, c.size());
          REQUIRE(decoded.ok());
          h = *decoded;
          bytes.assign(c.data(), c.data() + c.size());
        },
        caf::after(5s) >> [&] { FAIL("expected a chunk"); });
    self->send(edge, credit_atom::value, uint64_t{6}, uint32_t{1});
  };
  auto take_stat = [&](edge_stat& s) {
    self->receive([&](stats_atom, const edge_stat& x) { s = x; }, caf::after(5s) >> [&] { FAIL("expected stats"); });
  };
  send_tensor(0);
  wire_header h;
  std::vector<std::byte> payload;
  take(h, payload);
  CHECK(h.encoding == codec_kind::topk);
  CHECK(h.total_bytes == 64 * 64 * 4);
  CHECK(h.payload_bytes == payload.size());
  CHECK(payload.size() < h.total_bytes / 5);
  std::vector<float> dense(64 * 64);
  CHECK(decode_topk(payload, dense).ok());
  edge_stat s;
  take_stat(s);
  CHECK(s.bytes == payload.size());
  CHECK(s.dense_bytes == 64 * 64 * 4);
  CHECK(s.keep_ratio == doctest::Approx(0.1));
  CHECK(s.encode_s > 0);

  // Ratio 1 is dense and exact: the raw bytes travel.
  codec.keep_ratio = 1.0;
  self->send(edge, compress_atom::value, codec);
  send_tensor(1);
  take(h, payload);
  CHECK(h.encoding == codec_kind::none);
  CHECK(payload.size() == 64 * 64 * 4);
  take_stat(s);
  CHECK(s.keep_ratio == 1.0);
  CHECK(s.bytes == s.dense_bytes);
  self->send_exit(edge, caf::exit_reason::user_shutdown);
}
