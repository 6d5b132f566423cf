// train.micro-batches = auto (scheduler/micro_batches.hpp): the candidates, the efficiency
// model, the profile moved to other shapes, and the choice on synthetic profiles: a pipeline
// whose ops scale with their rows is bubble-dominated and wants more micro-batches, one whose
// ops cost the same whatever their rows (GEMM-bound at small sizes) wants fewer, and a memory
// limit under 1F1B rules out the few large micro-batches.
#include <doctest/doctest.h>

#include <string>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/plan.hpp"
#include "tests/scheduler/chain_model.hpp"

namespace fusion {
namespace {

// Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5.
const std::string chain = chain_model_text(16, 64, 64);
constexpr int64_t batch = 16;

graph chain_at(int64_t rows) { return parse_graph(chain, "chain.pbtxt", rows); }

// Four nodes on one site, placed evenly: a four-stage pipeline.
cluster_spec four_nodes() {
  std::string text = "name: \"c\"\nsite { name: \"a\" }\n";
  for (int i = 0; i < 4; ++i) text += "node { name: \"n" + std::to_string(i) + "\" site: \"a\" }\n";
  text += "placement { policy: \"even\" }\n";
  cluster_spec c = parse_cluster(text, "c.pbtxt");
  c.placement.policy = placement_policy::even;
  return c;
}

estimator_options quiet_links() {
  estimator_options o;
  o.local_mbit = 1e12;
  o.local_rtt_s = 0;
  o.coordinator_rtt_s = 0;
  return o;
}

// Measured at 4 micro-batches of 4 rows: every op 10 ms forward, 20 ms backward.
struct measured_run {
  cluster_spec c = four_nodes();
  graph g = chain_at(batch / 4);
  cluster_profile p;
  measured_run() {
    p = profile_from_cluster(c);
    p.micro_batches = 4;
    p.micro_batch = batch / 4;
    for (auto& n : p.nodes)
      for (const char* op : {"wte", "fc", "lm_head", "loss"}) n.ops[op_key(g, g.find(op))] = {0.01, 0.02, 0.001};
  }
  micro_batch_choice choose(double half_rows, std::optional<pipeline_schedule> fixed = std::nullopt) const {
    micro_batch_options o;
    o.cpu_half_rows = half_rows;
    return choose_micro_batches(
        batch, g, c, p, chain_at,
        [&](const workload_estimator& est, const cluster_profile& prof) { return plan_run(est.model(), c, prof); },
        fixed, quiet_links(), o);
  }
};

}  // namespace

TEST_CASE("scheduler/micro-batches: candidates, rows and the efficiency model") {
  CHECK(micro_batch_candidates(12, 64) == std::vector<int64_t>{1, 2, 3, 4, 6, 12});
  CHECK(micro_batch_candidates(64, 8) == std::vector<int64_t>{1, 2, 4, 8});
  const graph g = chain_at(4);
  CHECK(op_rows(g, g.find("fc")) == 4 * 64);  // B x T tokens of width C
  CHECK(op_rows(g, g.find("wte")) == 4);      // the token ids (B, T): rows are B
  CHECK(gemm_efficiency(8, 8) == doctest::Approx(0.5));
  // Linear where rows are far above half_rows, constant far below.
  CHECK(rescale_op_seconds(1.0, 1e6, 2e6, 8) == doctest::Approx(2.0).epsilon(1e-4));
  CHECK(rescale_op_seconds(1.0, 1, 2, 1e6) == doctest::Approx(1.0).epsilon(1e-4));
  CHECK(rescale_op_seconds(1.0, 8, 16, 8) == doctest::Approx(2.0 * 0.5 / (16.0 / 24)));
}

TEST_CASE("scheduler/micro-batches: the profile moves to the candidate's shapes") {
  const measured_run r;
  const graph g2 = chain_at(batch / 2);
  micro_batch_options o;
  o.cpu_half_rows = 8;
  const cluster_profile moved = rescale_profile(r.p, r.g, g2, 2, o);
  CHECK(moved.micro_batches == 2);
  CHECK(moved.micro_batch == batch / 2);
  const op_timing& fc = moved.nodes[1].ops.at(op_key(g2, g2.find("fc")));
  const double rows = 4 * 64;
  CHECK(fc.forward_s == doctest::Approx(rescale_op_seconds(0.01, rows, 2 * rows, 8)));
  CHECK(fc.backward_s == doctest::Approx(rescale_op_seconds(0.02, rows, 2 * rows, 8)));
  CHECK(fc.update_s == 0.001);  // the optimizer does not see M
  CHECK(moved.nodes[1].ops.count(op_key(r.g, r.g.find("fc"))) == 0);
}

TEST_CASE("scheduler/micro-batches: a bubble-dominated pipeline wants more, a GEMM-bound one fewer") {
  const measured_run r;
  // Op times proportional to rows: a step costs about (M + stages - 1) / M micro-batch-times of
  // the whole batch, so the most micro-batches win.
  const micro_batch_choice bubble = r.choose(1e-3);
  CAPTURE(format_candidates(bubble));
  CHECK(bubble.chosen == batch);
  CHECK(bubble.candidates.size() == 5);
  CHECK(bubble.candidates.front().step_s > 2 * bubble.candidates.back().step_s);
  CHECK(bubble.reason.find("fewer leave more of the pipeline idle") != std::string::npos);
  // Op times independent of rows (far below half_rows): every micro-batch costs the same, so
  // the fewest win.
  const micro_batch_choice gemm = r.choose(1e9);
  CAPTURE(format_candidates(gemm));
  CHECK(gemm.chosen == 1);
  CHECK(gemm.reason.find("more make every op's GEMMs smaller") != std::string::npos);
  // In between, an interior optimum: the bubble and the GEMMs balance.
  const micro_batch_choice mid = r.choose(256);
  CAPTURE(format_candidates(mid));
  CHECK(mid.chosen > 1);
  CHECK(mid.chosen < batch);
  CHECK(format_candidates(mid).find("M=1 ") == 0);
}

TEST_CASE("scheduler/micro-batches: memory under 1F1B rules out the large micro-batches") {
  measured_run r;
  const micro_batch_choice free = r.choose(1e9, pipeline_schedule::one_f_one_b);
  REQUIRE(free.chosen == 1);
  // Room for the 4-micro-batch candidate's peak only: 1 and 2 keep larger activations alive.
  double limit = 0;
  for (const auto& m : free.candidates)
    if (m.micro_batches == 4) limit = m.peak_bytes;
  REQUIRE(limit > 0);
  CHECK(free.candidates.front().peak_bytes > limit);
  for (auto& n : r.p.nodes) n.memory_bytes = static_cast<uint64_t>(limit) + 1;
  const micro_batch_choice tight = r.choose(1e9, pipeline_schedule::one_f_one_b);
  CAPTURE(format_candidates(tight));
  CHECK(tight.chosen == 4);
  CHECK(format_candidates(tight).find("M=1 ") == 0);
  CHECK(format_candidates(tight).find("on n") != std::string::npos);  // names the node short of memory
  // Nothing fits: the least memory, said so.
  for (auto& n : r.p.nodes) n.memory_bytes = 1;
  const micro_batch_choice none = r.choose(1e9, pipeline_schedule::one_f_one_b);
  CHECK(none.chosen == batch);
  CHECK(none.reason.find("no candidate fits in memory") != std::string::npos);
}

TEST_CASE("scheduler/micro-batches: a tie goes to fewer micro-batches, an empty list is refused") {
  micro_batch_prediction a, b;
  a.micro_batches = 4, a.step_s = 1.0;
  b.micro_batches = 2, b.step_s = 1.005;
  CHECK(pick_micro_batches({a, b}).chosen == 2);
  b.step_s = 1.2;
  CHECK(pick_micro_batches({a, b}).chosen == 4);
  CHECK_THROWS_AS(pick_micro_batches({}), std::invalid_argument);
}

}  // namespace fusion
