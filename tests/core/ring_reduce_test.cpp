// The ring all-reduce of stage replicas without actors: R reducers exchange their messages in a
// simulated ring (in order, out of order, with early arrivals) and every replica ends with the
// same bits, each chunk summed once along the ring.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <stdexcept>
#include <vector>

#include "compression/half.hpp"
#include "core/ring_reduce.hpp"

using namespace fusion;

namespace {

// Runs the all-reduce of `inputs` (one buffer per replica) delivering messages in the order
// `shuffle` chooses among those in flight (null: oldest first); replica `late` starts only after
// the first message was delivered (a slower backward: its predecessor's messages may wait). Returns every replica's final buffer.
// With `f16`, every message must carry values an f16 codec sends exactly.
std::vector<std::vector<float>> run_ring(const std::vector<std::vector<float>>& inputs, uint32_t late,
                                         std::mt19937* shuffle, bool f16 = false) {
  const auto R = static_cast<uint32_t>(inputs.size());
  std::vector<ring_reducer> rings;
  for (uint32_t r = 0; r < R; ++r) rings.emplace_back(r, R, f16);
  struct flight {
    uint32_t to;
    ring_reducer::message m;
  };
  std::deque<flight> wire;
  auto send = [&](uint32_t from, std::vector<ring_reducer::message> out) {
    for (auto& m : out) {
      if (f16)
        for (float x : m.values) CHECK(f16_bits_to_f32(f32_to_f16_bits(x)) == x);
      wire.push_back({(from + 1) % R, std::move(m)});
    }
  };
  for (uint32_t r = 0; r < R; ++r)
    if (r != late) send(r, rings[r].start(inputs[r]));
  bool late_started = false;
  size_t delivered = 0;
  for (;;) {
    if (!late_started && (delivered > 0 || wire.empty())) {
      late_started = true;
      send(late, rings[late].start(inputs[late]));
    }
    if (wire.empty()) break;
    size_t at = 0;
    if (shuffle) at = std::uniform_int_distribution<size_t>(0, wire.size() - 1)(*shuffle);
    // Messages between one pair stay in order (one edge): take the oldest one for that receiver.
    const uint32_t to = wire[at].to;
    for (size_t i = 0; i < wire.size(); ++i)
      if (wire[i].to == to) {
        at = i;
        break;
      }
    flight f = std::move(wire[at]);
    wire.erase(wire.begin() + static_cast<std::ptrdiff_t>(at));
    ++delivered;
    send(f.to, rings[f.to].receive(f.m.k, std::move(f.m.values)));
  }
  std::vector<std::vector<float>> out;
  for (auto& ring : rings) {
    CHECK(ring.done());
    out.push_back(ring.values());
  }
  return out;
}

}  // namespace

TEST_CASE("ring all-reduce: every replica ends with the same bits, the sum of all replicas") {
  std::mt19937 rng(5);
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (uint32_t R : {2u, 3u, 4u, 5u}) {
    for (size_t n : {size_t{1}, size_t{3}, size_t{10}, size_t{1001}}) {
      CAPTURE(R);
      CAPTURE(n);
      std::vector<std::vector<float>> inputs(R, std::vector<float>(n));
      for (auto& v : inputs)
        for (auto& x : v) x = value(rng);
      for (int order = 0; order < 3; ++order) {
        std::mt19937 shuffle(static_cast<unsigned>(order));
        auto out = run_ring(inputs, static_cast<uint32_t>(order) % R, order ? &shuffle : nullptr);
        for (uint32_t r = 1; r < R; ++r) CHECK(std::memcmp(out[r].data(), out[0].data(), n * sizeof(float)) == 0);
        // Chunk c is summed once, starting at replica c and going around the ring.
        for (uint32_t c = 0; c < R; ++c) {
          auto [a, b] = ring_reducer::chunk_range(n, c, R);
          for (size_t i = a; i < b; ++i) {
            float sum = inputs[c][i];
            for (uint32_t j = 1; j < R; ++j) sum = sum + inputs[(c + j) % R][i];
            CHECK(out[0][i] == sum);
          }
        }
      }
    }
  }
}

TEST_CASE("ring all-reduce: with f16 values every replica ends with the same rounded bits, close to the sum") {
  std::mt19937 rng(7);
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (uint32_t R : {2u, 3u, 5u}) {
    const size_t n = 1001;
    CAPTURE(R);
    std::vector<std::vector<float>> inputs(R, std::vector<float>(n));
    for (auto& v : inputs)
      for (auto& x : v) x = value(rng);
    for (int order = 0; order < 3; ++order) {
      std::mt19937 shuffle(static_cast<unsigned>(order));
      auto out = run_ring(inputs, static_cast<uint32_t>(order) % R, order ? &shuffle : nullptr, true);
      for (uint32_t r = 1; r < R; ++r) CHECK(std::memcmp(out[r].data(), out[0].data(), n * sizeof(float)) == 0);
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        CHECK(f16_bits_to_f32(f32_to_f16_bits(out[0][i])) == out[0][i]);  // the sum is an f16 value
        double sum = 0, scale = 0;
        for (uint32_t r = 0; r < R; ++r) sum += inputs[r][i], scale += std::abs(inputs[r][i]);
        // One f16 rounding (relative 2^-11) per hop of the partial sum, and one of the result.
        CHECK(std::abs(out[0][i] - sum) <= (R + 1) * std::ldexp(scale, -11) + 1e-7);
        worst = std::max(worst, std::abs(out[0][i] - sum));
      }
      CHECK(worst > 0);  // rounded: not the f32 sum
    }
  }
}

TEST_CASE("ring all-reduce: chunks cover the buffer, and bad messages are refused") {
  for (uint32_t R : {2u, 3u, 7u}) {
    size_t covered = 0;
    for (uint32_t c = 0; c < R; ++c) {
      auto [a, b] = ring_reducer::chunk_range(10, c, R);
      CHECK(a == covered);
      covered = b;
    }
    CHECK(covered == 10);
  }
  CHECK_THROWS_AS(ring_reducer(0, 1), std::invalid_argument);
  CHECK_THROWS_AS(ring_reducer(2, 2), std::invalid_argument);
  ring_reducer r(0, 3);
  CHECK(r.steps() == 4);
  CHECK_THROWS_WITH_AS(r.receive(4, {1.0f}), doctest::Contains("ring step 4 does not exist"), std::invalid_argument);
  CHECK(r.receive(1, {1.0f}).empty());  // early: kept until its turn
  CHECK_THROWS_WITH_AS(r.receive(1, {1.0f}), doctest::Contains("arrived twice"), std::invalid_argument);
  // Message 0 into replica 0 of 3 carries chunk 2 of 6 values: 2 values, not 5.
  CHECK(r.receive(0, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f}).empty());
  CHECK_THROWS_WITH_AS(r.start(std::vector<float>(6, 0.0f)), doctest::Contains("brought 5 values for a chunk of 2"),
                       std::invalid_argument);
}
