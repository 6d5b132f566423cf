// The training step's state machine without actors: reports in any order complete the step
// exactly once, the totals are summed in a fixed order, and reports that do not belong to the
// step in flight change nothing.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/step_machine.hpp"

using namespace fusion;
using verdict = step_machine::verdict;

TEST_CASE("step machine: every loss and every op's gradient, in any order, complete forward/backward once") {
  step_machine m;
  CHECK(m.current() == step_machine::stage::idle);
  m.begin(3, 2, {1, 2, 4}, 5);  // ops 1, 2, 4 compute; 0 and 3 are inputs
  CHECK(m.in_flight());
  CHECK(m.waiting_for_grads() == std::vector<int>{1, 2, 4});
  CHECK(m.on_grads(3, 4, 4.0) == verdict::counted);
  CHECK(m.on_loss(3, 1, 2.0) == verdict::counted);
  CHECK(m.on_grads(3, 1, 9.0) == verdict::counted);
  CHECK(m.on_loss(3, 0, 1.0) == verdict::counted);
  CHECK(m.waiting_for_grads() == std::vector<int>{2});
  CHECK(m.on_grads(3, 2, 12.0) == verdict::complete);
  CHECK(m.mean_loss() == 1.5);
  CHECK(m.grad_norm() == 5.0);
  m.begin_update();
  CHECK(m.current() == step_machine::stage::update);
  CHECK(m.updates_left() == 3);
  CHECK(m.on_stepped() == verdict::counted);
  CHECK(m.on_stepped() == verdict::counted);
  CHECK(m.on_stepped() == verdict::complete);
  CHECK(m.on_stepped() == verdict::refused);  // one reply too many
  m.reset();
  CHECK_FALSE(m.in_flight());
}

TEST_CASE("step machine: reports of another step, unknown micro-batches or ops, and repeats are refused") {
  step_machine m;
  m.begin(7, 2, {1}, 3);
  CHECK(m.on_loss(6, 0, 1.0) == verdict::refused);  // a late loss of the abandoned step 6
  CHECK(m.on_loss(7, 2, 1.0) == verdict::refused);  // micro-batch 2 of 2
  CHECK(m.on_grads(7, 0, 1.0) == verdict::refused);  // op 0 is an input: no gradient norm
  CHECK(m.on_grads(7, 5, 1.0) == verdict::refused);  // no op 5
  CHECK(m.on_grads(7, -1, 1.0) == verdict::refused);
  CHECK(m.on_loss(7, 0, 1.0) == verdict::counted);
  CHECK(m.on_loss(7, 0, 100.0) == verdict::refused);  // a repeat does not count twice
  CHECK(m.losses_in() == 1);
  CHECK(m.on_grads(7, 1, 1.0) == verdict::counted);
  CHECK(m.on_grads(7, 1, 1.0) == verdict::refused);
  CHECK(m.on_stepped() == verdict::refused);  // no update before forward/backward is complete
  CHECK(m.on_loss(7, 1, 3.0) == verdict::complete);
  CHECK(m.mean_loss() == 2.0);
  // Once the update began, a straggling loss changes nothing.
  m.begin_update();
  CHECK(m.on_loss(7, 1, 50.0) == verdict::refused);
  CHECK(m.mean_loss() == 2.0);
}

TEST_CASE("step machine: the totals do not depend on the order the reports arrived in") {
  const std::vector<double> losses = {0.1, 1e8, -1e8, 0.3};
  auto run = [&](std::vector<uint32_t> order) {
    step_machine m;
    m.begin(0, losses.size(), {0}, 1);
    for (uint32_t mb : order) m.on_loss(0, mb, losses[mb]);
    m.on_grads(0, 0, 1.0);
    return m.mean_loss();
  };
  const double a = run({0, 1, 2, 3}), b = run({3, 2, 1, 0}), c = run({2, 0, 3, 1});
  CHECK(a == b);  // bit-identical: summed in micro-batch order, not arrival order
  CHECK(a == c);
  step_machine empty;
  empty.begin(0, 0, {}, 0);
  CHECK(std::isnan(empty.mean_loss()));
}

TEST_CASE("step machine: with replicas, one report and one update per (op, replica), each op's norm counted once") {
  step_machine m;
  // Ops 1 and 2 compute; op 1 has 3 replicas, op 2 one; op 0 is an input (2 replicas, no report).
  m.begin(0, 2, {1, 2}, 3, {2, 3, 1});
  CHECK(m.on_loss(0, 0, 1.0) == verdict::counted);
  CHECK(m.on_loss(0, 1, 1.0) == verdict::counted);
  CHECK(m.on_grads(0, 1, 1, 9.0) == verdict::counted);
  CHECK(m.on_grads(0, 1, 1, 9.0) == verdict::refused);  // a repeat of replica 1
  CHECK(m.on_grads(0, 1, 3, 9.0) == verdict::refused);  // no replica 3
  CHECK(m.on_grads(0, 2, 1, 1.0) == verdict::refused);  // op 2 has one replica
  CHECK(m.on_grads(0, 2, 16.0) == verdict::counted);
  CHECK(m.waiting_for_grads() == std::vector<int>{1});
  CHECK(m.on_grads(0, 1, 0, 9.0) == verdict::counted);
  CHECK(m.waiting_for_grads() == std::vector<int>{1});  // replica 2 is still out
  CHECK(m.on_grads(0, 1, 2, 9.0) == verdict::complete);
  // The replicas hold the same all-reduced gradients: op 1 counts once, sqrt(9 + 16).
  CHECK(m.grad_norm() == 5.0);
  m.begin_update();
  CHECK(m.updates_left() == 4);
  for (int i = 0; i < 3; ++i) CHECK(m.on_stepped() == verdict::counted);
  CHECK(m.on_stepped() == verdict::complete);
}

TEST_CASE("step machine: with local steps, each replica group has its own norm and clips its replicas") {
  step_machine m;
  m.set_local_steps(true);
  // Op 1 has 2 replicas, op 2 one: group 0 = op 1 replica 0 + op 2, group 1 = op 1 replica 1 + op 2.
  m.begin(0, 2, {1, 2}, 3, {1, 2, 1});
  CHECK(m.on_loss(0, 0, 1.0) == verdict::counted);
  CHECK(m.on_loss(0, 1, 1.0) == verdict::counted);
  CHECK(m.on_grads(0, 1, 0, 9.0) == verdict::counted);
  CHECK(m.on_grads(0, 1, 1, 1.0) == verdict::counted);
  CHECK(m.on_grads(0, 2, 0, 16.0) == verdict::complete);
  const auto norms = m.replica_norms();
  REQUIRE(norms.size() == 2);
  CHECK(norms[0] == doctest::Approx(5.0));                // sqrt(9 + 16)
  CHECK(norms[1] == doctest::Approx(std::sqrt(17.0)));    // sqrt(1 + 16)
  CHECK(m.replica_norm(1, 0) == doctest::Approx(5.0));
  CHECK(m.replica_norm(1, 1) == doctest::Approx(std::sqrt(17.0)));
  CHECK(m.replica_norm(2, 0) == doctest::Approx(5.0));    // serves both groups: the larger
  CHECK(m.grad_norm() == doctest::Approx(5.0));
  // Synchronous steps: replica 0's norm per op, one global norm for every replica.
  m.set_local_steps(false);
  CHECK(m.grad_norm() == doctest::Approx(5.0));
  CHECK(m.replica_norm(1, 1) == doctest::Approx(5.0));
}
