// What a train_result keeps of a run: bounded, however long the run (bench/soak_bench.sh).
#include <doctest/doctest.h>

#include <cmath>

#include "actors/trainer.hpp"

using namespace fusion;

namespace {

// A step record shaped like gpt-char-small's: 61 compute ops, 4 micro-batches, one edge.
step_record measured_step(int64_t step) {
  step_record r;
  r.step = step;
  r.loss = 1.0 / static_cast<double>(step);
  for (int id = 0; id < 61; ++id) {
    op_measurement m;
    m.node = id;
    m.forward_s.assign(4, 0.001);
    m.backward_s.assign(4, 0.002);
    r.ops.push_back(std::move(m));
  }
  r.edges.push_back({1, 2, true, "a", "b", 100, 100, 4, 0.01, 0, 1});
  return r;
}

}  // namespace

TEST_CASE("actors/history: old steps lose their measurements, the newest keep them") {
  train_result r;
  for (int64_t s = 1; s <= 300; ++s) add_step_record(r, measured_step(s));
  REQUIRE(r.steps.size() == 300);
  CHECK(r.steps_run == 300);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    INFO("step " << r.steps[i].step);
    CHECK(r.steps[i].step == static_cast<int64_t>(i) + 1);
    CHECK(r.steps[i].loss == 1.0 / static_cast<double>(i + 1));  // every loss stays
    const bool measured = i + measured_steps_kept >= r.steps.size();
    CHECK(r.steps[i].ops.size() == (measured ? 61u : 0u));
    CHECK(r.steps[i].edges.size() == (measured ? 1u : 0u));
    if (!measured) CHECK(r.steps[i].ops.capacity() == 0);  // the memory is gone, not just cleared
  }
  CHECK(r.steps.back().ops.back().forward_s.size() == 4);
}

TEST_CASE("actors/history: at most `keep` records, the most recent, in order") {
  train_result r;
  const size_t keep = 160, keep_measured = 3;
  for (int64_t s = 1; s <= 5000; ++s) {
    add_step_record(r, measured_step(s), keep, keep_measured);
    REQUIRE(r.steps.size() <= keep);
  }
  CHECK(r.steps_run == 5000);
  CHECK(r.steps.size() >= keep - keep / 16);
  CHECK(r.steps.back().step == 5000);
  for (size_t i = 1; i < r.steps.size(); ++i) CHECK(r.steps[i].step == r.steps[i - 1].step + 1);
  size_t with_ops = 0;
  for (auto& s : r.steps) with_ops += s.ops.empty() ? 0 : 1;
  CHECK(with_ops == keep_measured);
}

TEST_CASE("actors/history: evaluations are bounded the same way") {
  train_result r;
  for (int64_t s = 1; s <= 1000; ++s) add_eval_record(r, s, {2.0, s % 2 ? 0.5 : NAN}, 100);
  CHECK(r.val_losses.size() <= 100);
  CHECK(r.val_losses.back() == std::pair<int64_t, double>{1000, 2.0});
  CHECK(r.val_accuracies.size() <= 100);
  CHECK(r.val_accuracies.back().first == 999);  // NaN accuracy: not recorded
  train_result d;
  add_eval_record(d, 7, {1.5, NAN});
  CHECK(d.val_losses.size() == 1);
  CHECK(d.val_accuracies.empty());
}
