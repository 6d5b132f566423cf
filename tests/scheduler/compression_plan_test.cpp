// Codecs of a plan's edges (scheduler/compression_plan.hpp): none, a fixed top-k, and AdaTopK
// from the estimator, on a two-node split of the tiny GPT over a link whose rate the test sets.
#include <doctest/doctest.h>

#include <string>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/plan.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

cluster_spec two_sites(double mbit) {
  return parse_cluster("name: \"two\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
                       "node { name: \"a1\" site: \"a\" }\nnode { name: \"b1\" site: \"b\" }\n"
                       "link { a: \"a\" b: \"b\" mbit: " + std::to_string(mbit) + " }\n",
                       "two.pbtxt");
}

// The first half of the graph on a1 with both inputs, the rest on b1 (the targets cross).
plan split_plan(const graph& g) {
  placement where{std::vector<int>(g.nodes.size(), 0)};
  for (size_t i = g.nodes.size() / 2; i < g.nodes.size(); ++i) where.node_of_op[i] = 1;
  where.node_of_op[g.find("targets")] = 0;
  where.node_of_op[g.find("tokens")] = 0;
  return make_plan(g, where);
}

struct fixture {
  graph g = load_graph(src("configs/models/gpt-char-small.pbtxt"), 4);
  cluster_spec c;
  plan p;
  std::unique_ptr<workload_estimator> est;
  explicit fixture(double mbit) : c(two_sites(mbit)), p(split_plan(g)) {
    cluster_profile prof = profile_from_cluster(c);
    prof.micro_batches = 4;
    est = std::make_unique<workload_estimator>(g, c, prof);
  }
};

TEST_CASE("scheduler/compression: none leaves every edge dense") {
  fixture f(8);
  compression_config cfg;
  assign_codecs(f.p, f.est.get(), cfg);
  REQUIRE(!f.p.edges.empty());
  for (auto& e : f.p.edges) {
    CHECK(e.setting.kind == codec_kind::none);
    CHECK(wire_bytes_per_micro_batch(e) == e.bytes_per_micro_batch);
  }
}

TEST_CASE("scheduler/compression: topk compresses every f32 edge at its ratio, never token ids") {
  fixture f(8);
  compression_config cfg;
  cfg.mode = codec_kind::topk;
  cfg.ratio = 0.1;
  cfg.error_feedback = true;
  assign_codecs(f.p, f.est.get(), cfg);
  int compressed = 0, tokens = 0;
  for (auto& e : f.p.edges) {
    if (!e.compressible) {
      ++tokens;
      CHECK(e.setting.kind == codec_kind::none);
      continue;
    }
    ++compressed;
    CHECK(e.setting.kind == codec_kind::topk);
    CHECK(e.setting.keep_ratio == doctest::Approx(0.1));
    CHECK(e.setting.error_feedback == (e.kind == edge_kind::backward));  // gradients only
    CHECK(wire_bytes_per_micro_batch(e) < e.bytes_per_micro_batch / 5);
  }
  CHECK(compressed > 0);
  CHECK(tokens > 0);  // the targets cross to b1 as int32 ids
  CHECK(format_plan(f.g, f.c, f.p).find("topk 10% f16") != std::string::npos);
}

TEST_CASE("scheduler/compression: adatopk compresses the slow link and leaves a fast one dense") {
  compression_config cfg;
  cfg.mode = codec_kind::adatopk;
  SUBCASE("slow") {
    fixture f(2);
    assign_codecs(f.p, f.est.get(), cfg);
    for (auto& g : link_groups(f.p, *f.est)) {
      INFO(link_group_name(f.c, g));
      CHECK(g.load.budget_s > 0);
      CHECK(g.load.mbit == doctest::Approx(2));
      const auto& s = f.p.edges[g.edges.front()].setting;
      // The default floors allow keep-all (every element, values in f16) and int8, never int4
      // or top-k: at 2 Mbit/s the link needs int8, whose rung travels as the int8 codec.
      CHECK(s.kind == codec_kind::int8);
      CHECK(wire_bytes_per_micro_batch(f.p.edges[g.edges.front()]) <
            f.p.edges[g.edges.front()].bytes_per_micro_batch * 0.3);
    }
    // The prediction follows: the compressed plan's step is faster than the dense one.
    plan dense = split_plan(f.g);
    CHECK(f.est->simulate(f.p).step_s < f.est->simulate(dense).step_s);
    // With lower floors, the slow link goes further down the ladder (int8, int4, top-k), at or
    // above its floor, and its bytes shrink with it.
    cfg.adaptive.floor_activations = 0.1;
    cfg.adaptive.floor_gradients = 0.2;
    assign_codecs(f.p, f.est.get(), cfg);
    for (auto& g : link_groups(f.p, *f.est)) {
      const auto& e = f.p.edges[g.edges.front()];
      INFO(link_group_name(f.c, g) << ": " << codec_text(e.setting));
      CHECK(e.setting.keep_ratio < keep_all_ratio);
      CHECK(e.setting.keep_ratio >= (g.load.forward ? 0.1 : 0.2));
      CHECK(wire_bytes_per_micro_batch(e) < e.bytes_per_micro_batch * 0.3);
    }
  }
  SUBCASE("fast") {
    fixture f(1e6);
    assign_codecs(f.p, f.est.get(), cfg);
    for (auto& e : f.p.edges) CHECK(e.setting.keep_ratio == 1.0);
  }
}

TEST_CASE("scheduler/compression: the cut bytes ratio is the codec's wire bytes per fp32 byte") {
  compression_config c;
  CHECK(cut_bytes_ratio(c) == 1.0);
  c.mode = codec_kind::int8;  // a byte per element and an f32 scale per 64
  CHECK(cut_bytes_ratio(c) == doctest::Approx((1 + 4.0 / 64) / 4).epsilon(0.01));
  c.mode = codec_kind::int4;
  CHECK(cut_bytes_ratio(c) == doctest::Approx((0.5 + 4.0 / 64) / 4).epsilon(0.01));
  c.mode = codec_kind::topk;
  c.ratio = 0.1;  // f16 values and their positions: well under a fifth, above a tenth
  CHECK(cut_bytes_ratio(c) > 0.05);
  CHECK(cut_bytes_ratio(c) < 0.2);
  // AdaTopK: its floors bound it, and the denser direction counts (a link carries both).
  c.mode = codec_kind::adatopk;
  // Default floors: int8 both ways (a byte per element and an f32 scale per 64).
  const double int8_bytes = cut_bytes_ratio(c);
  CHECK(int8_bytes == doctest::Approx((1 + 4.0 / 64) / 4).epsilon(0.01));
  c.adaptive.floor_activations = int4_level;
  CHECK(cut_bytes_ratio(c) == int8_bytes);  // gradients still at int8
  c.adaptive.floor_gradients = int4_level;
  CHECK(cut_bytes_ratio(c) == doctest::Approx((0.5 + 4.0 / 64) / 4).epsilon(0.01));
  // f16 floors: the keep-all rung (halves, and a block header per 4096 elements).
  c.adaptive.floor_activations = c.adaptive.floor_gradients = 1.0;
  CHECK(cut_bytes_ratio(c) > 0.5);
  CHECK(cut_bytes_ratio(c) < 0.55);
}

// The compression-aware DP (issue 30): OP-Fence also prices the cuts at the codec's bytes, not
// only simulates its candidates with codecs. Over a 5 or 8 Mbit/s link (where the dense plan
// keeps the whole model on one node) the compressed run splits over both sites, and the search
// with the compressed cuts is never predicted slower than without them. (Before fan-out nodes
// halved the bytes of a residual cut, it also found a faster plan at 5 Mbit/s with int8; now the
// dense DP's cuts already include it here.)
TEST_CASE("scheduler/compression: OP-Fence's DP prices a cut at the codec's bytes") {
  for (double mbit : {5.0, 8.0}) {
    for (codec_kind mode : {codec_kind::int8, codec_kind::int4}) {
      CAPTURE(mbit);
      CAPTURE(to_string(mode));
      fixture f(mbit);
      compression_config c;
      c.mode = mode;
      opfence_options o;
      o.prepare_plan = [&](plan& candidate) { assign_codecs(candidate, f.est.get(), c); };
      opfence_report simulated_only, aware;
      opfence_place(*f.est, o, &simulated_only);
      o.cut_bytes_ratio = cut_bytes_ratio(c);
      const placement chosen = opfence_place(*f.est, o, &aware);
      CHECK(aware.candidates > simulated_only.candidates);
      CHECK(aware.chain.size() == 2);
      CHECK(aware.estimate.step_s <= simulated_only.estimate.step_s);
      // What plan_compressed_run gives a user (fusion-cluster plan, fusion-train) is that plan.
      opfence_report run;
      f.c.placement.policy = placement_policy::opfence;
      workload_estimator est(f.g, f.c, f.est->profile());
      plan p = plan_compressed_run(est, f.est->profile(), c, 1, &run);
      CHECK(run.estimate.step_s == doctest::Approx(aware.estimate.step_s));
      CHECK(p.where.node_of_op == chosen.node_of_op);
    }
  }
}

}  // namespace
}  // namespace fusion
