// Workload-estimator tests: the simulated step against schedules worked out by hand (two stages,
// three micro-batches, a compute-bound and a link-bound case, one micro-batch), one node, nodes
// under a CPU quota (their budget, and the host work of their traffic), a residual fan-out that
// crosses a cut twice, the op::cost fallback and constructor errors. Refinement from
// measurements: estimator_refine_test.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "core/graph_loader.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/quota_budget.hpp"
#include "tests/scheduler/chain_model.hpp"
#include "tests/support/op_tables.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

// Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5. At micro-batch 1 every
// activation between wte and lm_head is 1x4x8 f32 = 128 bytes.
const std::string chain_model = chain_model_text(16, 4, 8);

// wte feeds fc and the residual add: cutting after wte sends its output twice. Graph node ids:
// tokens 0, targets 1, wte 2, fc 3, res 4, lm_head 5, loss 6.
const char* residual_model = R"(name: "residual"
const { name: "V" value: 16 }
const { name: "T" value: 4 }
const { name: "C" value: 8 }
input { name: "tokens"  shape: "B,T" dtype: I32 }
input { name: "targets" shape: "B,T" dtype: I32 }
node { name: "wte" op: "token_embedding" in: "tokens" attr { key: "vocab" value: "V" } attr { key: "dim" value: "C" } }
node { name: "fc" op: "linear" in: "wte" attr { key: "out" value: "C" } attr { key: "bias" value: "false" } }
node { name: "res" op: "add" in: "wte" in: "fc" }
node { name: "lm_head" op: "linear" in: "res" attr { key: "out" value: "V" } attr { key: "bias" value: "false" } }
node { name: "loss" op: "cross_entropy" in: "lm_head" in: "targets" }
tokens: "tokens"  targets: "targets"  logits: "lm_head"  loss: "loss"
)";

// One linear big enough that arithmetic, not memory traffic, bounds it: 256x256 by 256x256.
const std::string matmul_model = chain_model_text(16, 256, 256);

cluster_spec one_node() {
  return parse_cluster("name: \"one\"\nsite { name: \"a\" }\nnode { name: \"a0\" site: \"a\" }\n", "one.pbtxt");
}

// No round trips anywhere, so transfers are bytes over rate and the optimizer is the updates
// plus three 0.1 s coordinator round trips.
estimator_options exact_options() {
  estimator_options o;
  o.local_rtt_s = 0;
  o.coordinator_rtt_s = 0.1;
  o.quota_phases = 1;  // quota periods start with the step
  return o;
}

// 128 bytes = 1024 bit: 1 s per tensor at this rate.
const double one_second_mbit = 1024e-6;

TEST_CASE("scheduler/estimator: two stages, three micro-batches, schedule by hand") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites();
  REQUIRE(g.nodes.size() == 6);
  // Stage 0 on a0: tokens, wte, fc. Stage 1 on b0: targets, lm_head, loss.
  plan p = make_plan(g, placement{{0, 1, 0, 0, 1, 1}});
  REQUIRE(p.edges.size() == 2);  // fc -> lm_head, both directions
  CHECK(p.edges[0].bytes_per_micro_batch == 128);

  SUBCASE("compute-bound: transfers of 1 s") {
    workload_estimator est(g, c, timed_profile(g, c, 3, one_second_mbit, chain_times), exact_options());
    CHECK(est.transfer_s(128, 0, 1) == doctest::Approx(1.0));
    // Times in s; "x.fm"/"x.bm" is forward/backward of op x for micro-batch m; ready = when
    // its last input/gradient arrived. a0 runs wte (f1 b1) and fc (f1 b2); b0 lm_head (f2 b2)
    // and loss (f1 b1). The feed interval is the slower node's forward per micro-batch: b0's
    // 2 + 1 = 3, so micro-batches are fed at 0, 3 and 6.
    //  0- 1 a0 wte.f0    1- 2 a0 fc.f0 -> link 2-3, arrives 3
    //  3- 4 a0 wte.f1    4- 5 a0 fc.f1 -> link 5-6, arrives 6
    //  6- 7 a0 wte.f2    7- 8 a0 fc.f2 -> link 8-9, arrives 9
    //  3- 5 b0 lm_head.f0   5- 6 b0 loss.f0
    //  6- 7 b0 loss.b0 (ready 6 like lm_head.f1: m0 first)
    //  7- 9 b0 lm_head.f1 (ready 6, before lm_head.b0 ready 7)
    //  9-11 b0 lm_head.b0 (ready 7) -> link 11-12, arrives 12
    // 11-12 b0 loss.f1 (ready 9, m1 before lm_head.f2's m2)   12-14 b0 lm_head.f2 (ready 9)
    // 14-15 b0 loss.b1 (ready 12)   15-16 b0 loss.f2 (ready 14)
    // 16-18 b0 lm_head.b1 (ready 15) -> link 18-19, arrives 19
    // 18-19 b0 loss.b2   19-21 b0 lm_head.b2 -> link 21-22, arrives 22
    // 12-14 a0 fc.b0   14-15 a0 wte.b0   19-21 a0 fc.b1   21-22 a0 wte.b1
    // 22-24 a0 fc.b2   24-25 a0 wte.b2
    step_estimate s = est.simulate(p);
    CHECK(s.feed_interval_s == doctest::Approx(3));
    CHECK(s.pipeline_s == doctest::Approx(25));
    CHECK(s.optimizer_s == doctest::Approx(1.3));
    CHECK(s.step_s == doctest::Approx(26.3));
    REQUIRE(s.edge_s.size() == 2);
    CHECK(s.edge_s[0] == doctest::Approx(3.0));  // 3 micro-batches x 1 s
    CHECK(s.edge_s[1] == doctest::Approx(3.0));
    REQUIRE(s.node_compute_s.size() == 2);
    CHECK(s.node_compute_s[0] == doctest::Approx(3 * (1 + 1) + 0.5 + 3 * (1 + 2) + 0.5));
    CHECK(s.node_compute_s[1] == doctest::Approx(3 * (2 + 2) + 1 + 3 * (1 + 1)));
    CHECK(s.node_memory_bytes[0] == doctest::Approx(est.memory_bytes(2) + est.memory_bytes(3)));
    CHECK(s.node_memory_bytes[1] == doctest::Approx(est.memory_bytes(4) + est.memory_bytes(5)));
  }

  SUBCASE("link-bound: transfers of 4 s") {
    workload_estimator est(g, c, timed_profile(g, c, 3, one_second_mbit / 4, chain_times), exact_options());
    // a0 runs the forwards as above (fc.fm done at 2, 5, 8), but one 4 s link serialises them:
    // fc.f0 link 2-6, fc.f1 6-10, fc.f2 10-14 (arrivals 6, 10, 14).
    //  6- 8 b0 lm_head.f0     8- 9 b0 loss.f0        9-10 b0 loss.b0
    // 10-12 b0 lm_head.b0 (ready 10 with lm_head.f1: m0 first) -> link b0->a0 12-16, arrives 16
    // 12-14 b0 lm_head.f1     14-15 b0 loss.f1 (ready 14 with lm_head.f2: m1 first)
    // 15-17 b0 lm_head.f2 (ready 14, before loss.b1 ready 15)   17-18 b0 loss.b1
    // 18-19 b0 loss.f2 (ready 17)   19-21 b0 lm_head.b1 -> link 21-25, arrives 25
    // 21-22 b0 loss.b2        22-24 b0 lm_head.b2 -> link busy until 25: 25-29, arrives 29
    // 16-18 a0 fc.b0  18-19 a0 wte.b0  25-27 a0 fc.b1  27-28 a0 wte.b1  29-31 a0 fc.b2  31-32 a0 wte.b2
    step_estimate s = est.simulate(p);
    CHECK(s.pipeline_s == doctest::Approx(32));
    CHECK(s.step_s == doctest::Approx(33.3));
    CHECK(s.edge_s[0] == doctest::Approx(12.0));
  }

  SUBCASE("one micro-batch: every op and both transfers in sequence") {
    workload_estimator est(g, c, timed_profile(g, c, 1, one_second_mbit, chain_times), exact_options());
    // wte.f 0-1, fc.f 1-2, link 2-3, lm_head.f 3-5, loss.f 5-6, loss.b 6-7, lm_head.b 7-9,
    // link 9-10, fc.b 10-12, wte.b 12-13.
    step_estimate s = est.simulate(p);
    CHECK(s.pipeline_s == doctest::Approx(13));
    CHECK(s.step_s == doctest::Approx(14.3));
    CHECK(s.edge_s[0] == doctest::Approx(1.0));
  }
}

TEST_CASE("scheduler/estimator: one node runs every op serially") {
  SUBCASE("timed ops") {
    graph g = parse_graph(chain_model, "chain.pbtxt", 1);
    cluster_spec c = one_node();
    estimator_options o = exact_options();
    workload_estimator est(g, c, timed_profile(g, c, 3, 1, chain_times), o);
    step_estimate s = est.simulate(make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)}));
    // M * sum(fwd + bwd) + sum(update) + 3 round trips.
    CHECK(s.step_s == doctest::Approx(3 * (2 + 3 + 4 + 2) + 2 + 0.3));
    CHECK(s.pipeline_s == doctest::Approx(33));
    CHECK(s.edge_s.empty());
  }
  SUBCASE("gpt-char-tiny from op::cost") {
    graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 2);
    cluster_spec c = one_node();
    cluster_profile prof = profile_from_cluster(c);
    prof.micro_batches = 4;
    workload_estimator est(g, c, prof);
    double work = 0, update = 0;
    for (auto& n : g.nodes) {
      work += est.forward_s(n.id, 0) + est.backward_s(n.id, 0);
      update += est.update_s(n.id, 0);
    }
    REQUIRE(work > 0);
    step_estimate s = est.simulate(make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)}));
    CHECK(s.pipeline_s == doctest::Approx(4 * work));
    CHECK(s.step_s == doctest::Approx(4 * work + update + 3 * est.options().coordinator_rtt_s));
    CHECK(s.node_compute_s[0] == doctest::Approx(4 * work + update));
  }
}

TEST_CASE("scheduler/quota budget: work runs at full speed until the period's budget is spent, then waits") {
  const cpu_quota q{0.3, 0.1};  // 0.03 s of CPU in every 0.1 s period
  quota_budget b(q, true, 0);
  REQUIRE(b.binding());
  // 0.03 s in period 0, the other 0.02 s from the start of period 1.
  CHECK(b.run(0, 0.05) == doctest::Approx(0.12));
  CHECK(b.runnable_at(0.11) == doctest::Approx(0.11));  // period 1 has 0.01 s left
  CHECK(b.run(0.12, 0.01) == doctest::Approx(0.13));
  CHECK(b.runnable_at(0.15) == doctest::Approx(0.2));   // spent: the next period
  // From the middle of period 2: 0.03 there, 0.03 in each of periods 3 and 4, 0.01 in period 5.
  CHECK(b.run(0.25, 0.1) == doctest::Approx(0.51));
  // Work that ends exactly as a period's budget runs out ends there, not at the next period.
  CHECK(b.run(0.6, 0.06) == doctest::Approx(0.73));
  CHECK(b.runnable_at(0.75) == doctest::Approx(0.8));
  // Periods that start 0.05 s before the step: the first one ends 0.05 s into it.
  quota_budget shifted(q, true, 0.05);
  CHECK(shifted.run(0, 0.05) == doctest::Approx(0.07));
  // A quota that does not bind holds nothing back.
  quota_budget free(q, false, 0);
  CHECK_FALSE(free.binding());
  CHECK(free.run(1, 0.5) == doctest::Approx(1.5));
  CHECK(free.runnable_at(1.2) == doctest::Approx(1.2));
}

TEST_CASE("scheduler/estimator: a node under a CPU quota runs at full speed within its budget") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  SUBCASE("one busy node: held to the quota's share of every period") {
    cluster_spec c = one_node();
    cluster_profile prof = timed_profile(g, c, 3, 1, chain_times);
    prof.nodes[0].quota = {0.5, 1};
    workload_estimator est(g, c, prof, exact_options());
    CHECK(est.quota_stretch(0) == doctest::Approx(2));
    CHECK(est.step_compute_s(2, 0) == doctest::Approx(2 * (3 * (1 + 1) + 0.5)));
    step_estimate s = est.simulate(make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)}));
    // 33 s of ops at 0.5 s per 1 s period: the 66th half period ends at 65.5 s. The 2 s of
    // updates start with that period's budget spent: periods 66-69, done at 69.5.
    CHECK(s.pipeline_s == doctest::Approx(65.5));
    CHECK(s.optimizer_s == doctest::Approx(4 + 0.3));
    CHECK(s.node_compute_s[0] == doctest::Approx(33 + 2));
    // A quota of a core or more, or a GPU node, does not hold a serial node back.
    prof.nodes[0].quota.cores = 1.5;
    workload_estimator free(g, c, prof, exact_options());
    CHECK(free.quota_stretch(0) == 1);
    CHECK(free.simulate(make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)})).pipeline_s ==
          doctest::Approx(33));
  }
  SUBCASE("a pipeline stage with idle gaps runs faster than its quota's share") {
    cluster_spec c = estimator_sites();
    plan p = make_plan(g, placement{{0, 1, 0, 0, 1, 1}});
    cluster_profile prof = timed_profile(g, c, 3, 1e3, chain_times);
    prof.nodes[1].quota.cores = 0.5;
    // The old rule, op time = CPU time / quota on a capped node: b0's times doubled.
    cluster_profile stretched = timed_profile(g, c, 3, 1e3, chain_times);
    for (auto& [key, t] : stretched.nodes[1].ops) t = {2 * t.forward_s, 2 * t.backward_s, 2 * t.update_s};
    const double old_rule = workload_estimator(g, c, stretched, exact_options()).simulate(p).pipeline_s;
    // Periods far shorter than an op: the budget is a steady half speed, the old rule's result.
    prof.nodes[1].quota.period_s = 1e-3;
    const double fine = workload_estimator(g, c, prof, exact_options()).simulate(p).pipeline_s;
    CHECK(fine == doctest::Approx(old_rule).epsilon(0.01));
    // Periods of 10 s (5 s of budget each): b0 works 4 s of the first and waits between
    // micro-batches, so part of its work runs at full speed and the step is shorter.
    prof.nodes[1].quota.period_s = 10;
    const double coarse = workload_estimator(g, c, prof, exact_options()).simulate(p).pipeline_s;
    MESSAGE("pipeline: CPU time / quota " << old_rule << " s, 1 ms periods " << fine << " s, 10 s periods "
                                          << coarse << " s");
    CHECK(coarse < old_rule - 1);
    // Never faster than the same node without a quota.
    prof.nodes[1].quota.cores = 0;
    CHECK(coarse >= workload_estimator(g, c, prof, exact_options()).simulate(p).pipeline_s - 1e-9);
  }
}

TEST_CASE("scheduler/estimator: a quota changed while the run trains is followed") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = one_node();
  cluster_profile prof = timed_profile(g, c, 3, 1, chain_times);
  prof.nodes[0].quota = {0.6, 0.1};
  workload_estimator est(g, c, prof, exact_options());
  const plan p = make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)});
  const double at_06 = est.simulate(p).pipeline_s;
  // Throttled to 0.2 of a core: the op times (CPU times) stay, the budget per period shrinks.
  CHECK(est.set_quota(0, {0.2, 0.1}));
  CHECK(est.quota_stretch(0) == doctest::Approx(5));
  CHECK(est.profile().nodes[0].quota.cores == 0.2);
  const double at_02 = est.simulate(p).pipeline_s;
  CHECK(at_02 == doctest::Approx(3 * at_06).epsilon(0.01));
  CHECK_FALSE(est.set_quota(0, {0.2, 0.1}));  // the same quota: nothing to change
  CHECK(est.set_quota(0, {1.5, 0.1}));          // a core and a half: no longer held back
  CHECK(est.quota_stretch(0) == 1);
  CHECK_FALSE(est.set_quota(0, {}));            // ... which is the same as no quota
  CHECK(est.set_quota(0, {0.2, 0.1}));
  // Uncapped again: full speed, the quota's budget gone.
  CHECK(est.set_quota(0, {}));
  CHECK(est.quota_stretch(0) == 1);
  CHECK(est.simulate(p).pipeline_s == doctest::Approx(33));
  // A GPU node's quota does not hold its kernels back: nothing to follow.
  prof.nodes[0].device = "cuda:0";
  workload_estimator gpu(g, c, prof, exact_options());
  CHECK_FALSE(gpu.set_quota(0, {0.2, 0.1}));
  CHECK_THROWS_AS(est.set_quota(1, {}), std::out_of_range);
}

TEST_CASE("scheduler/estimator: a capped node's step is the mean over the phases of its quota periods") {
  // One node, 11 s of ops per step in sequence, half a core in periods of P = 44/3 s: the ops
  // need 1.5 periods' budget. A period that starts with the step (phase 0): 0.5 P of work, a
  // pause to P, the rest by 1.25 P. A quarter period in at the step's start: work to 0.5 P, a
  // pause to 0.75 P, done at 1.0 P. Half-way in: work to 0.5 P, the next period's budget from
  // there, done at 0.75 P; three quarters in: 0.25 P of work, then 0.5 P more from 0.25 P,
  // done at 0.75 P.
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = one_node();
  cluster_profile prof = timed_profile(g, c, 1, 1, chain_times);
  const double P = 44.0 / 3;
  prof.nodes[0].quota = {0.5, P};
  const plan all_here = make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)});
  estimator_options o = exact_options();
  CHECK(workload_estimator(g, c, prof, o).simulate(all_here).pipeline_s == doctest::Approx(1.25 * P));
  o.quota_phases = 4;
  const step_estimate four = workload_estimator(g, c, prof, o).simulate(all_here);
  CHECK(four.pipeline_s == doctest::Approx((1.25 + 1.0 + 0.75 + 0.75) / 4 * P));
  CHECK(four.step_s == doctest::Approx(four.pipeline_s + four.optimizer_s));
  CHECK(four.node_compute_s[0] == doctest::Approx(11 + 2));
  // Without a binding quota every phase is the same step: one simulation.
  prof.nodes[0].quota.cores = 2;
  CHECK(workload_estimator(g, c, prof, o).simulate(all_here).pipeline_s == doctest::Approx(11));
}

TEST_CASE("scheduler/estimator: a capped node's quota pays for the bytes it sends and receives") {
  // Graph node ids as chain_model; activations 1x256x256 f32 = 256 KiB at micro-batch 1.
  graph g = parse_graph(matmul_model, "matmul.pbtxt", 1);
  cluster_spec c = estimator_sites();
  const double tensor = 256.0 * 256 * 4;
  const plan cut = make_plan(g, placement{{0, 0, 0, 1, 1, 1}});
  REQUIRE(cut.find(2, 0, true) != nullptr);
  REQUIRE(cut.find(2, 0, true)->bytes_per_micro_batch == tensor);
  SUBCASE("learnt from what the ops' times miss, per byte moved") {
    workload_estimator est(g, c, timed_profile(g, c, 1, 1e3, chain_times), exact_options());
    CHECK(est.traffic_s_per_byte() == 0);
    est.observe_host_traffic(1.0, 100 * 1024);  // too few bytes to tell traffic from noise
    CHECK(est.traffic_s_per_byte() == 0);
    est.observe_host_traffic(0.04, 1e6);
    CHECK(est.traffic_s_per_byte() == doctest::Approx(40e-9));
    est.observe_host_traffic(-1, 1e6);  // ops timed longer than the process ran: nothing missed
    const double w = estimator_options{}.ema_weight;
    CHECK(est.traffic_s_per_byte() == doctest::Approx((1 - w) * 40e-9));
    est.observe_host_traffic(100, 1e6);  // a one-off (a page-in), not traffic: held at 50 ns a byte
    CHECK(est.traffic_s_per_byte() == doctest::Approx((1 - w) * (1 - w) * 40e-9 + w * 50e-9));
    // A part of the cluster keeps it.
    CHECK(est.restricted(c, {0, 1}).traffic_s_per_byte() == est.traffic_s_per_byte());
  }
  SUBCASE("the simulation charges it to the sending and receiving tasks of a capped node only") {
    // wte on a0; fc, lm_head and the loss on b0: fc's forward receives one tensor and its
    // backward sends one gradient back; M = 1 runs every task one after another.
    const plan& p = cut;
    cluster_profile prof = timed_profile(g, c, 1, 1e3, chain_times);
    prof.nodes[1].quota = {0.5, 1e-3};  // a steady half speed
    auto step_with = [&](const cluster_profile& pr, double per_byte) {
      workload_estimator est(g, c, pr, exact_options());
      if (per_byte > 0) est.observe_host_traffic(per_byte * 1e6, 1e6);
      return est.simulate(p).pipeline_s;
    };
    const double base = step_with(prof, 0), charged = step_with(prof, 40e-9);
    // 2 tensors x 10.5 ms of host work, at half speed.
    CHECK(charged - base == doctest::Approx(2 * 2 * 40e-9 * tensor).epsilon(0.05));
    // Uncapped, the same bytes cost the pipeline nothing (other cores move them).
    prof.nodes[1].quota = {};
    CHECK(step_with(prof, 40e-9) == doctest::Approx(step_with(prof, 0)));
    // Nothing crosses a one-node plan.
    prof.nodes[0].quota = {0.5, 1e-3};
    workload_estimator one(g, c, prof, exact_options());
    const plan local = make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)});
    const double alone = one.simulate(local).pipeline_s;
    one.observe_host_traffic(40e-9 * 1e6, 1e6);
    CHECK(one.simulate(local).pipeline_s == doctest::Approx(alone));
  }
}

TEST_CASE("scheduler/estimator: an output is charged its gradient and a copy per consumer that keeps its inputs") {
  graph g = parse_graph(residual_model, "residual.pbtxt", 1);
  cluster_spec c = estimator_sites();
  workload_estimator est(g, c, profile_from_cluster(c));
  const int wte = g.find("wte"), fan = g.find("wte.fan"), fc = g.find("fc"), res = g.find("res");
  const int lm_head = g.find("lm_head");
  REQUIRE(fan >= 0);
  // Read by the fan-out node only, which keeps nothing: the gradient alone.
  CHECK(est.activation_bytes(wte) == doctest::Approx(est.output_bytes(wte)));
  // Read by fc (a linear keeps its input for the weight gradient) and by res (an add keeps none).
  CHECK(est.activation_bytes(fan) == doctest::Approx(2 * est.output_bytes(fan)));
  CHECK(est.activation_bytes(fc) == doctest::Approx(est.output_bytes(fc)));
  CHECK(est.activation_bytes(res) == doctest::Approx(2 * est.output_bytes(res)));
  CHECK(est.activation_bytes(lm_head) == doctest::Approx(2 * est.output_bytes(lm_head)));
  CHECK(est.activation_bytes(g.find("tokens")) == 0);
  const double params = est.param_bytes(fc);
  CHECK(est.memory_bytes(fc) == doctest::Approx(4 * params + est.micro_batches() * est.output_bytes(fc)));

  // Without the fan-out node wte's output is kept once, by fc.
  graph plain = parse_graph_with(residual_model, "residual.pbtxt", 1, test::op_table_without_fanouts());
  workload_estimator unfanned(plain, c, profile_from_cluster(c));
  CHECK(unfanned.activation_bytes(plain.find("wte")) == doctest::Approx(2 * unfanned.output_bytes(plain.find("wte"))));
}

TEST_CASE("scheduler/estimator: a residual fan-out across a cut is sent twice, once through a fan-out node") {
  // Without the loader's fan-out nodes: wte's two readers.
  graph g = parse_graph_with(residual_model, "residual.pbtxt", 1, test::op_table_without_fanouts());
  cluster_spec c = estimator_sites();
  {
    // With them, the cut after wte carries its tensor once each way (wte.fan joins fc and res).
    graph fanned = parse_graph(residual_model, "residual.pbtxt", 1);
    REQUIRE(fanned.nodes[3].name == "wte.fan");
    placement after_wte(std::vector<int>(fanned.nodes.size(), 1));
    after_wte.node_of_op[fanned.find("tokens")] = after_wte.node_of_op[fanned.find("wte")] = 0;
    after_wte.node_of_op[fanned.find("wte.fan")] = 0;
    CHECK(make_plan(fanned, after_wte).edges.size() == 2);
  }
  REQUIRE(g.nodes[2].consumers.size() == 2);
  REQUIRE(g.nodes[2].consumers[0].node == 3);  // fc first, then res
  const std::vector<std::pair<std::string, op_timing>> fast = {
      {"wte", {0.1, 0.1, 0}}, {"fc", {0.1, 0.1, 0}}, {"res", {0.1, 0.1, 0}},
      {"lm_head", {0.1, 0.1, 0}}, {"loss", {0.1, 0.1, 0}}};
  for (int M : {1, 3}) {
    INFO("micro-batches " << M);
    workload_estimator est(g, c, timed_profile(g, c, M, one_second_mbit, fast), exact_options());
    // Cut after wte: wte -> fc and wte -> res both cross.
    plan twice = make_plan(g, placement{{0, 1, 0, 1, 1, 1, 1}});
    // Cut after res: only res -> lm_head crosses.
    plan once = make_plan(g, placement{{0, 1, 0, 0, 0, 1, 1}});
    REQUIRE(twice.edges.size() == 4);
    REQUIRE(once.edges.size() == 2);
    step_estimate s2 = est.simulate(twice), s1 = est.simulate(once);
    for (double e : s2.edge_s) CHECK(e == doctest::Approx(M * 1.0));
    CHECK(s2.pipeline_s > s1.pipeline_s + 0.5);
    if (M == 1) {
      // Twice: wte.f 0-0.1, link 0.1-1.1 (to fc) and 1.1-2.1 (to res); fc.f 1.1-1.2, res.f
      // 2.1-2.2, lm_head.f, loss.f, loss.b, lm_head.b, res.b 2.2-2.7; res's gradient to wte on
      // the link 2.7-3.7, fc.b 2.7-2.8 and its gradient queued behind: 3.7-4.7; wte.b 4.7-4.8.
      CHECK(s2.pipeline_s == doctest::Approx(4.8));
      // Once: three forwards 0-0.3, link 0.3-1.3, four tasks on b0 to 1.7, link 1.7-2.7, three
      // backwards to 3.0.
      CHECK(s1.pipeline_s == doctest::Approx(3.0));
    }
  }
}

TEST_CASE("scheduler/estimator: links default to the local rate within a site and without a link") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites(true);  // a0 (a), b0 (b), a1 (a), c0 (c, no link)
  estimator_options o;
  o.local_mbit = 5000;
  o.local_rtt_s = 2e-4;
  workload_estimator est(g, c, profile_from_cluster(c), o);
  CHECK(est.link_mbit(0, 1) == doctest::Approx(100));
  CHECK(est.link_rtt_s(0, 1) == doctest::Approx(2e-4));  // the cluster file states no round trip
  CHECK(est.link_mbit(0, 2) == doctest::Approx(5000));
  CHECK(est.link_mbit(1, 3) == doctest::Approx(5000));
  CHECK(est.link_rtt_s(0, 0) == 0);
}

TEST_CASE("scheduler/estimator: without timings op::cost over the node's rate") {
  graph g = parse_graph(matmul_model, "matmul.pbtxt", 1);
  cluster_spec c = estimator_sites();
  cluster_profile prof = profile_from_cluster(c);
  prof.nodes[0].gflops = 20;
  prof.nodes[1].gflops = 40;
  workload_estimator est(g, c, prof);
  const int fc = 3;
  const double mnk = 256.0 * 256 * 256;
  CHECK(est.forward_s(fc, 0) == doctest::Approx(2 * mnk / 20e9));
  CHECK(est.backward_s(fc, 0) == doctest::Approx(4 * mnk / 20e9));
  CHECK(est.forward_s(fc, 1) == doctest::Approx(est.forward_s(fc, 0) / 2));
  CHECK(est.backward_s(fc, 1) == doctest::Approx(est.backward_s(fc, 0) / 2));
  // AdamW on a CPU node: parameters, gradients and two moments at 10 GB/s.
  const double param_bytes = 256.0 * 256 * 4;
  CHECK(est.update_s(fc, 0) == doctest::Approx(4 * param_bytes / 10e9));
  CHECK(est.output_bytes(fc) == doctest::Approx(256.0 * 256 * 4));
  CHECK(est.memory_bytes(fc) == doctest::Approx(4 * param_bytes + 2 * 1 * 256.0 * 256 * 4));
  CHECK(est.memory_bytes(0) == 0);
  CHECK(est.forward_s(0, 0) == 0);

  // A node that states no rate gets the default.
  prof.nodes[1].gflops = 0;
  estimator_options o;
  o.default_gflops = 10;
  workload_estimator slow(g, c, prof, o);
  CHECK(slow.forward_s(fc, 1) == doctest::Approx(2 * mnk / 10e9));
}

TEST_CASE("scheduler/estimator: a profile that does not match the cluster is refused") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites();
  cluster_profile prof = profile_from_cluster(c);
  prof.nodes.pop_back();
  CHECK_THROWS_AS(workload_estimator(g, c, prof), std::invalid_argument);
  try {
    workload_estimator est(g, c, prof);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("1 nodes but cluster 'two' has 2") != std::string::npos);
  }
  cluster_profile zero = profile_from_cluster(c);
  zero.micro_batches = 0;
  CHECK_THROWS_AS(workload_estimator(g, c, zero), std::invalid_argument);
  workload_estimator est(g, c, profile_from_cluster(c));
  CHECK_THROWS_AS(est.simulate(make_plan(g, placement{{0, 0, 0, 0, 0, 2}})), std::invalid_argument);
}

}  // namespace
}  // namespace fusion
