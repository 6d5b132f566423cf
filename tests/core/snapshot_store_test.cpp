// The snapshot store's rules (core/snapshot_store.hpp): a snapshot counts only whole and with
// its sender's checksum; a damaged or partial one is never used and never displaces the older
// complete one; the buddy choice and the newest step common to every op.
#include <doctest/doctest.h>

#include <vector>

#include "core/snapshot_store.hpp"

using namespace fusion;

namespace {

// The state of a toy op at `step`: three tensors whose values depend on the step.
std::vector<tensor> state_at(uint64_t step) {
  const float s = static_cast<float>(step);
  return {tensor::from({2, 2}, std::vector<float>{s, s + 1, s + 2, s + 3}), tensor::from({3}, std::vector<float>{-s, 0, s}),
          tensor::from({1}, std::vector<float>{s * 10})};
}

// Streams every tensor of `ts` (in `order`) into `store` as the snapshot of `step`.
void stream(snapshot_store& store, uint64_t step, const std::vector<tensor>& ts, std::vector<uint32_t> order = {0, 1, 2}) {
  for (uint32_t i : order) REQUIRE(store.add(step, i, ts[i]).ok());
}

}  // namespace

TEST_CASE("snapshot_store: a whole snapshot with its sender's checksum counts, in either order") {
  snapshot_store store(3);
  const auto s4 = state_at(4);
  stream(store, 4, s4, {2, 0, 1});
  CHECK(store.complete_steps().empty());  // whole, but not verified yet
  REQUIRE(store.checksum_of(4).has_value());
  CHECK(*store.checksum_of(4) == snapshot_checksum(s4));
  REQUIRE(store.seal(4, snapshot_checksum(s4)).ok());
  CHECK(store.complete_steps() == std::vector<uint64_t>{4});
  auto got = store.get(4);
  REQUIRE(got.has_value());
  REQUIRE(got->size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(snapshot_checksum({(*got)[i]}) == snapshot_checksum({s4[i]}));

  // The checksum first, then the tensors.
  const auto s5 = state_at(5);
  REQUIRE(store.seal(5, snapshot_checksum(s5)).ok());
  stream(store, 5, s5);
  CHECK(store.complete_steps() == std::vector<uint64_t>{5});  // keep 1: step 4 went
  CHECK_FALSE(store.get(4).has_value());
}

TEST_CASE("snapshot_store: a checksum mismatch drops the damaged snapshot and keeps the older complete one") {
  snapshot_store store(3);
  const auto s2 = state_at(2);
  stream(store, 2, s2);
  REQUIRE(store.seal(2, snapshot_checksum(s2)).ok());
  auto s3 = state_at(3);
  REQUIRE(store.seal(3, snapshot_checksum(s3)).ok());
  s3[1].f32()[1] = 42.f;  // one value damaged on the way
  REQUIRE(store.add(3, 0, s3[0]).ok());
  REQUIRE(store.add(3, 1, s3[1]).ok());
  auto last = store.add(3, 2, s3[2]);
  REQUIRE_FALSE(last.ok());
  CHECK(last.error().find("damaged") != std::string::npos);
  CHECK(store.complete_steps() == std::vector<uint64_t>{2});
  CHECK(store.pending_steps().empty());
  REQUIRE(store.get(2).has_value());
  CHECK(snapshot_checksum(*store.get(2)) == snapshot_checksum(s2));
  // A snapshot whose shape differs from the sender's is damaged as well.
  auto s4 = state_at(4);
  REQUIRE(store.seal(4, snapshot_checksum(s4)).ok());
  s4[0].reshape({4});
  REQUIRE(store.add(4, 0, s4[0]).ok());
  REQUIRE(store.add(4, 1, s4[1]).ok());
  CHECK_FALSE(store.add(4, 2, s4[2]).ok());
  CHECK(store.complete_steps() == std::vector<uint64_t>{2});
}

TEST_CASE("snapshot_store: a partial stream never counts and the older complete snapshot stays") {
  snapshot_store store(3);
  const auto s6 = state_at(6), s7 = state_at(7);
  stream(store, 6, s6);
  REQUIRE(store.seal(6, snapshot_checksum(s6)).ok());
  // Step 7's stream is cut after two tensors (the sender's node was lost mid-stream).
  REQUIRE(store.seal(7, snapshot_checksum(s7)).ok());
  REQUIRE(store.add(7, 0, s7[0]).ok());
  REQUIRE(store.add(7, 2, s7[2]).ok());
  CHECK(store.complete_steps() == std::vector<uint64_t>{6});
  CHECK(store.pending_steps() == std::vector<uint64_t>{7});
  CHECK_FALSE(store.checksum_of(7).has_value());
  CHECK_FALSE(store.get(7).has_value());
  // The next snapshot that completes supersedes both.
  const auto s8 = state_at(8);
  stream(store, 8, s8);
  REQUIRE(store.seal(8, snapshot_checksum(s8)).ok());
  CHECK(store.complete_steps() == std::vector<uint64_t>{8});
  CHECK(store.pending_steps().empty());
}

TEST_CASE("snapshot_store: the newest complete snapshots are kept up to `keep`, newest first") {
  snapshot_store store(3, 2);
  for (uint64_t step = 1; step <= 4; ++step) {
    const auto s = state_at(step);
    stream(store, step, s);
    REQUIRE(store.seal(step, snapshot_checksum(s)).ok());
  }
  CHECK(store.complete_steps() == std::vector<uint64_t>{4, 3});
  CHECK(store.bytes() == 2 * (4 + 3 + 1) * sizeof(float));
}

TEST_CASE("snapshot_store: misfit tensors and late checksums are refused, the store unchanged") {
  snapshot_store store(3);
  const auto s5 = state_at(5);
  CHECK(store.add(5, 3, s5[0]).error().find("out of range") != std::string::npos);
  REQUIRE(store.add(5, 0, s5[0]).ok());
  CHECK(store.add(5, 0, s5[0]).error().find("came twice") != std::string::npos);
  REQUIRE(store.add(5, 1, s5[1]).ok());
  REQUIRE(store.add(5, 2, s5[2]).ok());
  REQUIRE(store.seal(5, snapshot_checksum(s5)).ok());
  CHECK(store.add(4, 0, s5[0]).error().find("complete snapshot of step 5") != std::string::npos);
  CHECK_FALSE(store.seal(5, 1).ok());
  CHECK(store.complete_steps() == std::vector<uint64_t>{5});
}

TEST_CASE("snapshot_buddies: the next live node on another site, else on the same site, never itself") {
  // Three sites, one node each: a ring.
  CHECK(snapshot_buddies({"a", "b", "c"}, {true, true, true}) == std::vector<int>{1, 2, 0});
  // n1 lost: n0 skips it.
  CHECK(snapshot_buddies({"a", "b", "c"}, {true, false, true}) == std::vector<int>{2, -1, 0});
  // Two nodes on site a, one on b: a's nodes skip their site-mate.
  CHECK(snapshot_buddies({"a", "a", "b"}, {true, true, true}) == std::vector<int>{2, 2, 0});
  // One site: the next node.
  CHECK(snapshot_buddies({"a", "a", "a"}, {true, true, true}) == std::vector<int>{1, 2, 0});
  // Alone: nobody.
  CHECK(snapshot_buddies({"a", "b"}, {true, false}) == std::vector<int>{-1, -1});
}

TEST_CASE("newest_common_step: the newest step every op has, else nothing") {
  CHECK(newest_common_step({{5, 4}, {4}, {6, 5, 4}}) == std::optional<uint64_t>{4});
  CHECK(newest_common_step({{5, 4}, {5, 4, 5}}) == std::optional<uint64_t>{5});
  CHECK_FALSE(newest_common_step({{5}, {4}}).has_value());
  CHECK_FALSE(newest_common_step({{5}, {}}).has_value());
  CHECK_FALSE(newest_common_step({}).has_value());
}

TEST_CASE("snapshot stores on a buddy still share a step when their node is lost mid-round") {
  // Two ops of a lost node, held on its buddy: both have step 5; step 10 completed for the first
  // only (the node died while the second's checksum was on its way).
  std::vector<snapshot_store> held(2, snapshot_store(3, snapshot_keep_buddy));
  for (auto& s : held) {
    stream(s, 5, state_at(5));
    REQUIRE(s.seal(5, snapshot_checksum(state_at(5))).ok());
    stream(s, 10, state_at(10));
  }
  REQUIRE(held[0].seal(10, snapshot_checksum(state_at(10))).ok());
  std::vector<std::vector<uint64_t>> steps;
  for (auto& s : held) steps.push_back(s.complete_steps());
  CHECK(newest_common_step(steps) == std::optional<uint64_t>{5});
  CHECK(snapshot_keep_local >= snapshot_keep_buddy);
}
