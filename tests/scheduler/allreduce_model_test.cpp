// The estimator's model of the gradient all-reduce against schedules worked out by hand: ring
// steps one after another (a chunk, then the next once it arrived), the op actors' host work per
// byte (learned from measured ring work), and the replicas' own start times.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "tests/scheduler/chain_model.hpp"

namespace fusion {
namespace {

// Parameters: wte 512 bytes, fc 256, lm_head 512 (graph nodes 2, 3, 4).
const std::string chain_model = chain_model_text(16, 4, 8);

// Three sites of one node each, every link at the same rate.
cluster_spec three_sites() {
  return parse_cluster("name: \"three\"\nsite { name: \"a\" }\nsite { name: \"b\" }\nsite { name: \"c\" }\n"
                       "node { name: \"a0\" site: \"a\" }\nnode { name: \"b0\" site: \"b\" }\n"
                       "node { name: \"c0\" site: \"c\" }\n"
                       "link { a: \"a\" b: \"b\" mbit: 100 }\nlink { a: \"b\" b: \"c\" mbit: 100 }\n"
                       "link { a: \"a\" b: \"c\" mbit: 100 }\n",
                       "three.pbtxt");
}

estimator_options quiet_options() {
  estimator_options o;
  o.local_rtt_s = 0;
  o.coordinator_rtt_s = 0.1;
  o.ring_host_gbs = 1e9;  // host work negligible until measured
  return o;
}

TEST_CASE("scheduler/allreduce: ring work bytes and the host rate before and after measuring") {
  CHECK(workload_estimator::ring_work_bytes(512, 1) == 0);
  CHECK(workload_estimator::ring_work_bytes(0, 3) == 0);
  CHECK(workload_estimator::ring_work_bytes(512, 2) == doctest::Approx(4 * 512));
  CHECK(workload_estimator::ring_work_bytes(300, 3) == doctest::Approx(300 * (2 + 4.0 * 2 / 3)));
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = three_sites();
  cluster_profile p = chain_timed_profile(g, c, 3, 1, 0);
  p.nodes[1].cpu_share = 0.25;  // a capped node works at a quarter of a core
  estimator_options o;
  o.ring_host_gbs = 2;
  workload_estimator est(g, c, p, o);
  CHECK(est.ring_s_per_byte(0) == doctest::Approx(0.5e-9));
  CHECK(est.ring_s_per_byte(1) == doctest::Approx(2e-9));
  CHECK(est.param_bytes(2) == 512);
  CHECK(est.param_bytes(0) == 0);
  est.observe_allreduce(1, 1000, 1e-3);
  CHECK(est.ring_s_per_byte(1) == doctest::Approx(1e-6));
  est.observe_allreduce(1, 1000, 2e-3);  // a moving average, like every other measurement
  CHECK(est.ring_s_per_byte(1) == doctest::Approx(1e-6 + o.ema_weight * 1e-6));
  est.observe_allreduce(1, 0, 1);        // nothing measured: ignored
  est.observe_allreduce(1, 1000, -1);
  CHECK(est.ring_s_per_byte(1) == doctest::Approx(1e-6 + o.ema_weight * 1e-6));
  CHECK_THROWS(est.observe_allreduce(3, 1000, 1));
}

TEST_CASE("scheduler/allreduce: three replicas run their four ring steps one after another") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = three_sites();
  // 512 bytes take 1 s on every link, 0.2 s round trips.
  workload_estimator est(g, c, chain_timed_profile(g, c, 3, 512 * 8 / 1e6, 0.2), quiet_options());
  placement one{std::vector<int>(6, 0)};
  plan three = make_plan(g, replicate(one, {{{0, 1, 2}, {1, 1, 1}}}, 3));
  step_estimate s = est.simulate(three);
  // One micro-batch per replica: forward 5 s, backward loss 1, lm_head 2, fc 2, wte 1 (11 s).
  // Each ring step carries a third of the op's gradient and waits for the previous one: wte's
  // 4 steps of (512 / 3 bytes at 512 B/s + 0.1 s) start at 11 s; lm_head's (from 8 s) and fc's
  // (256 bytes, from 10 s, done by 11.07 s) are over before wte's first chunk is sent.
  const double wte_ring = 4 * (1.0 / 3 + 0.1);
  CHECK(s.allreduce_exposed_s == doctest::Approx(wte_ring).epsilon(1e-6));
  CHECK(s.pipeline_s == doctest::Approx(11 + wte_ring).epsilon(1e-6));
  // 2 (R - 1) chunks of P / R per link, R links, every op with parameters.
  CHECK(s.allreduce_bytes == doctest::Approx(4.0 / 3 * 1280 * 3));
  CHECK(s.allreduce_s == doctest::Approx(2 * wte_ring + 4 * (0.5 / 3 + 0.1)).epsilon(1e-6));
}

TEST_CASE("scheduler/allreduce: measured ring work delays the all-reduce by its host time") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = three_sites();
  workload_estimator est(g, c, chain_timed_profile(g, c, 4, 512 * 8 / 1e6, 0), quiet_options());
  placement one{std::vector<int>(6, 0)};
  plan two = make_plan(g, replicate(one, {{{0, 1}, {1, 1}}}, 4));
  step_estimate before = est.simulate(two);
  // Two micro-batches per replica (22 s); wte's ring, two chunks of 256 bytes at 0.5 s each,
  // starts at 22 s and is the exposed part (as in tests/scheduler/replicas_test.cpp).
  CHECK(before.allreduce_exposed_s == doctest::Approx(1).epsilon(1e-6));
  CHECK(before.allreduce_work_s == doctest::Approx(0).epsilon(1e-6));

  // Both replicas' nodes measured 1 ms of ring work per byte it touched.
  est.observe_allreduce(0, 1000, 1);
  est.observe_allreduce(1, 1000, 1);
  step_estimate after = est.simulate(two);
  // wte (h = 1e-3 s/B, P = 512, chunk 256): flatten 0.512, copy chunk 0 0.256, send 0.5, add and
  // copy 0.512, send 0.5, add the last chunk and unflatten 0.768: 1 + 2 x 512 x 2 x 1e-3 s.
  // fc's ring (from 21 s, 1.524 s) is off the link before wte's first chunk (22.768 s).
  CHECK(after.allreduce_exposed_s == doctest::Approx(1 + 2.048).epsilon(1e-6));
  CHECK(after.pipeline_s == doctest::Approx(22 + 3.048).epsilon(1e-6));
  // Every replica's work: ring_work_bytes(P, 2) = 4 P for the 1280 bytes of parameters.
  CHECK(after.allreduce_work_s == doctest::Approx(2 * 4 * 1280 * 1e-3).epsilon(1e-6));
  CHECK(after.allreduce_bytes == doctest::Approx(before.allreduce_bytes));
}

TEST_CASE("scheduler/allreduce: an f16 all-reduce puts half the bytes on the ring") {
  // Larger gradients (wte and lm_head 8 KiB, fc 4 KiB), so the codec's header hardly counts.
  graph g = parse_graph(chain_model_text(64, 4, 32), "chain.pbtxt", 1);
  cluster_spec c = three_sites();
  workload_estimator est(g, c, chain_timed_profile(g, c, 4, 512 * 8 / 1e6, 0), quiet_options());
  placement one{std::vector<int>(6, 0)};
  plan two = make_plan(g, replicate(one, {{{0, 1}, {1, 1}}}, 4));
  compression_config f16;
  f16.allreduce = value_type::f16;
  plan half = two;
  assign_codecs(half, &est, f16);
  for (auto& e : half.edges) CHECK(e.setting.values == value_type::f16);
  const step_estimate a = est.simulate(two), b = est.simulate(half);
  // The codec's header per tensor aside, half the bytes, and about half the exposed ring.
  CHECK(b.allreduce_bytes < 0.55 * a.allreduce_bytes);
  CHECK(b.allreduce_bytes > 0.5 * a.allreduce_bytes);
  CHECK(a.allreduce_exposed_s > 1);
  CHECK(b.allreduce_exposed_s < 0.6 * a.allreduce_exposed_s);
  CHECK(b.pipeline_s < a.pipeline_s);
}

TEST_CASE("scheduler/allreduce: a ring waits for its slowest replica's backward") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = three_sites();
  workload_estimator est(g, c, chain_timed_profile(g, c, 4, 512 * 8 / 1e6, 0), quiet_options());
  // a0 measured as profiled, b0 twice as slow on every op (wte, fc, lm_head, loss).
  const std::vector<std::pair<double, double>> profiled = {{1, 1}, {1, 2}, {2, 2}, {1, 1}};
  for (int id : {2, 3, 4, 5}) {
    const auto [f, b] = profiled[id - 2];
    est.observe_op(id, 0, f, b);
    est.observe_op(id, 1, 2 * f, 2 * b);
  }
  placement one{std::vector<int>(6, 0)};
  plan two = make_plan(g, replicate(one, {{{0, 1}, {1, 1}}}, 4));
  step_estimate s = est.simulate(two);
  // b0 runs its two micro-batches in 44 s; a0 in 22 s. wte's ring starts when b0's wte backward
  // ends (44 s) and takes 1 s; the makespan is b0's.
  CHECK(s.pipeline_s == doctest::Approx(45).epsilon(1e-6));
  CHECK(s.allreduce_exposed_s == doctest::Approx(1).epsilon(1e-6));
}

}  // namespace
}  // namespace fusion
