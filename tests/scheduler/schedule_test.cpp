// Pipeline schedules: the live bound per op from a placement (positions of pipeline and
// replicated stages), and the estimator's simulation of the schedules: GPipe and 1F1B take the
// same makespan on equal stages without link costs, 1F1B with less peak activation memory, and
// 1F1B is faster than GPipe where a slow link carries both directions; choose_schedule picks the
// fastest prediction.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/schedule.hpp"
#include "tests/scheduler/chain_model.hpp"

namespace fusion {
namespace {

// Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5.
const std::string chain = chain_model_text(16, 4, 8);

// `n` nodes n0.. on one site (local links), or on two sites a (n0, n1) and b (the rest) joined
// by a link of `mbit`.
cluster_spec nodes(int n, double mbit = 0) {
  std::string text = "name: \"c\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n";
  for (int i = 0; i < n; ++i)
    text += "node { name: \"n" + std::to_string(i) + "\" site: \"" + (mbit > 0 && i >= n / 2 ? "b" : "a") + "\" }\n";
  if (mbit > 0) text += "link { a: \"a\" b: \"b\" mbit: " + std::to_string(mbit) + " }\n";
  return parse_cluster(text, "c.pbtxt");
}

// Every op forward 1 s, backward 2 s (or `bwd`), no update, on every node; links at `mbit`.
workload_estimator equal_ops(const graph& g, const cluster_spec& c, int M, double bwd = 2, double mbit = 1e12) {
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = M;
  for (auto& l : p.links) l.mbit = mbit, l.rtt_s = 0;
  for (auto& n : p.nodes)
    for (const char* op : {"wte", "fc", "lm_head", "loss"}) n.ops[op_key(g, g.find(op))] = {1, bwd, 0};
  estimator_options o;
  o.local_mbit = 1e12;
  o.local_rtt_s = 0;
  o.coordinator_rtt_s = 0;
  return workload_estimator(g, c, p, o);
}

plan with(plan p, pipeline_schedule s) {
  p.schedule = s;
  return p;
}

double peak(const step_estimate& e) { return *std::max_element(e.node_memory_bytes.begin(), e.node_memory_bytes.end()); }

TEST_CASE("scheduler/schedule: names, positions and live bounds") {
  pipeline_schedule s = pipeline_schedule::gpipe;
  CHECK(parse_schedule("1f1b", s));
  CHECK(s == pipeline_schedule::one_f_one_b);
  CHECK(parse_schedule("gpipe", s));
  CHECK(s == pipeline_schedule::gpipe);
  CHECK(parse_schedule("eager", s));
  CHECK(s == pipeline_schedule::eager);
  CHECK_FALSE(parse_schedule("auto", s));
  CHECK_FALSE(parse_schedule("1F1B ", s));
  CHECK(std::string(schedule_name(pipeline_schedule::one_f_one_b)) == "1f1b");

  graph g = parse_graph(chain, "chain.pbtxt", 1);
  // Four stages, one op each; the inputs sit with their consumers.
  placement four{{0, 3, 0, 1, 2, 3}};
  auto pos = positions_of(g, four);
  CHECK(pos.stages == 4);
  CHECK(pos.position == std::vector<int>{-1, -1, 0, 1, 2, 3});
  CHECK(live_limits(g, four, pipeline_schedule::one_f_one_b) == std::vector<int>{0, 0, 4, 3, 2, 1});
  CHECK(live_limits(g, four, pipeline_schedule::gpipe) == std::vector<int>(6, 0));
  CHECK(live_limits(g, four, pipeline_schedule::eager) == std::vector<int>(6, 0));
  // Node numbers do not decide the order, the ops do: n2 holds the first ops.
  placement swapped{{2, 0, 2, 2, 0, 0}};
  CHECK(live_limits(g, swapped, pipeline_schedule::one_f_one_b) == std::vector<int>{0, 0, 2, 2, 1, 1});
  // One node: one stage, one micro-batch at a time.
  CHECK(live_limits(g, placement{std::vector<int>(6, 0)}, pipeline_schedule::one_f_one_b) ==
        std::vector<int>{0, 0, 1, 1, 1, 1});
  // Replicated stages count once: stage 0 (n0, n1) and stage 1 (n2).
  placement rep = replicate(placement{{0, 2, 0, 0, 2, 2}}, {{{0, 1}, {1, 1}}}, 4);
  CHECK(positions_of(g, rep).stages == 2);
  CHECK(live_limits(g, rep, pipeline_schedule::one_f_one_b) == std::vector<int>{0, 0, 2, 2, 1, 1});
}

TEST_CASE("scheduler/schedule: equal stages without link costs, GPipe and 1F1B have the same makespan") {
  graph g = parse_graph(chain, "chain.pbtxt", 1);
  cluster_spec c = nodes(4);
  const plan p = make_plan(g, placement{{0, 3, 0, 1, 2, 3}});
  for (int M : {1, 4, 8}) {
    CAPTURE(M);
    workload_estimator est = equal_ops(g, c, M);
    const step_estimate gp = est.simulate(with(p, pipeline_schedule::gpipe));
    const step_estimate ob = est.simulate(with(p, pipeline_schedule::one_f_one_b));
    const step_estimate ea = est.simulate(with(p, pipeline_schedule::eager));
    MESSAGE("M " << M << ": gpipe " << gp.pipeline_s << " s, 1f1b " << ob.pipeline_s << " s, eager " << ea.pipeline_s);
    // The bubble of S = 4 equal stages: (M + S - 1) x (forward + backward).
    CHECK(ob.pipeline_s == doctest::Approx((M + 3) * 3.0));
    CHECK(gp.pipeline_s == doctest::Approx(ob.pipeline_s));
    // 1F1B keeps at most S - position micro-batches: the first stage 4 of 8, the last 1.
    if (M == 8) {
      CHECK(peak(ob) < peak(gp));
      CHECK(ob.node_memory_bytes[3] < gp.node_memory_bytes[3]);
      CHECK(ob.node_memory_bytes[0] == doctest::Approx(4 * est.state_bytes(2) / 3 + 2.0 * 4 * est.output_bytes(2)));
      CHECK(gp.node_memory_bytes[0] == doctest::Approx(4 * est.state_bytes(2) / 3 + 2.0 * 8 * est.output_bytes(2)));
    }
  }
}

TEST_CASE("scheduler/schedule: a slow link carrying both directions favours 1F1B over GPipe") {
  graph g = parse_graph(chain, "chain.pbtxt", 1);
  // n0, n1 on site a, n2, n3 on site b: the cut fc -> lm_head crosses the slow link, so its
  // activations (forward) and gradients (backward) share it, one FIFO per direction. 128 bytes
  // at 256e-6 Mbit/s: 4 s a tensor, twice a stage's work per micro-batch (forward 1 s and
  // backward 1 s): the link is the bottleneck. (The profile's rate counts, not the cluster
  // file's, which cannot go below 1 kbit/s.)
  cluster_spec c = nodes(4, 8);
  const plan p = make_plan(g, placement{{0, 3, 0, 1, 2, 3}});
  workload_estimator est = equal_ops(g, c, 8, 1, 256e-6);
  REQUIRE(est.transfer_s(128, 1, 2) == doctest::Approx(4.0));
  const step_estimate gp = est.simulate(with(p, pipeline_schedule::gpipe));
  const step_estimate ob = est.simulate(with(p, pipeline_schedule::one_f_one_b));
  const step_estimate ea = est.simulate(with(p, pipeline_schedule::eager));
  MESSAGE("gpipe " << gp.pipeline_s << " s, 1f1b " << ob.pipeline_s << " s, eager " << ea.pipeline_s << " s");
  // GPipe sends all 8 activations (32 s), then all 8 gradients (32 s more); 1F1B sends gradients
  // while activations still go the other way, 3 micro-batches in flight past the link.
  CHECK(ob.pipeline_s < 0.8 * gp.pipeline_s);
  const schedule_choice choice = choose_schedule(est, p);
  CHECK(choice.step_of(pipeline_schedule::one_f_one_b) == doctest::Approx(ob.step_s));
  CHECK(choice.step_of(pipeline_schedule::gpipe) == doctest::Approx(gp.step_s));
  CHECK(choice.step_of(pipeline_schedule::eager) == doctest::Approx(ea.step_s));
  CHECK(choice.step_of(choice.chosen) == doctest::Approx(std::min({gp.step_s, ob.step_s, ea.step_s})));
  CHECK(choice.chosen != pipeline_schedule::gpipe);
  CHECK(choice.reason.find(schedule_name(choice.chosen)) == 0);
  CHECK(format_predictions(choice).find(" s under gpipe (peak node memory ") != std::string::npos);
}

TEST_CASE("scheduler/schedule: auto keeps eager for one stage") {
  graph g = parse_graph(chain, "chain.pbtxt", 1);
  cluster_spec c = nodes(1);
  workload_estimator est = equal_ops(g, c, 4);
  const schedule_choice choice = choose_schedule(est, make_plan(g, placement{std::vector<int>(6, 0)}));
  CHECK(choice.chosen == pipeline_schedule::eager);
  CHECK(choice.reason.find("one pipeline stage") != std::string::npos);
}

}  // namespace
}  // namespace fusion
