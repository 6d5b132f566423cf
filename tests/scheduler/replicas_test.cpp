// Stage-replica tests: a plan whose stages all have one replica is today's plan (edges, ids,
// order); replicated plans wire exactly the replica pairs the routes join; routes are dealt in
// proportion and deterministically; diffs list replicas and routes; the estimator splits a
// replicated stage's micro-batches and adds the all-reduce it does not hide.
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "tests/scheduler/chain_model.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

// Parameters: wte 512 bytes, fc 256, lm_head 512; activations between wte and lm_head 128 bytes
// at micro-batch 1.
const std::string chain_model = chain_model_text(16, 4, 8);

// Nodes a0, a1 (site a), b0, b1 (site b), 100 Mbit/s between the sites.
cluster_spec four_nodes() {
  return parse_cluster("name: \"four\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
                       "node { name: \"a0\" site: \"a\" }\nnode { name: \"a1\" site: \"a\" }\n"
                       "node { name: \"b0\" site: \"b\" }\nnode { name: \"b1\" site: \"b\" }\n"
                       "link { a: \"a\" b: \"b\" mbit: 100 }\n",
                       "four.pbtxt");
}

using edge_row = std::tuple<uint64_t, edge_kind, int, int, int, int, int, int, int>;
constexpr edge_kind fwd = edge_kind::forward, bwd = edge_kind::backward, red = edge_kind::reduce;

std::vector<edge_row> rows_of(const plan& p) {
  std::vector<edge_row> out;
  for (auto& e : p.edges)
    out.emplace_back(e.id, e.kind, e.producer, e.consumer, e.consumer_index, e.producer_replica, e.consumer_replica,
                     e.from, e.to);
  return out;
}

TEST_CASE("scheduler/replicas: a plan whose stages all have one replica is the pipeline plan") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 2);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  c.placement.policy = placement_policy::even;
  placement pipeline = place_ops(g, c);
  plan before = make_plan(g, pipeline, 5);
  REQUIRE(!before.edges.empty());
  for (int micro : {1, 4, 7}) {
    // No stages named: every node that holds ops becomes a stage of one replica.
    placement same = replicate(pipeline, {}, micro);
    CHECK(same.stages.size() == 3);
    CHECK(!same.replicated());
    plan after = make_plan(g, same, 5);
    CHECK(rows_of(after) == rows_of(before));
    CHECK(after.next_edge_id == before.next_edge_id);
    // The diff sees nothing: same edges, nodes and routes.
    CHECK(diff(before, after).empty());
    for (int k = 0; k < 3; ++k) CHECK(after.ops_on(k) == before.ops_on(k));
  }
  // Stages named explicitly with one node each are the same thing.
  placement named = replicate(pipeline, {{{2}, {1.0}}, {{0}, {1.0}}, {{1}, {3.0}}}, 4);
  CHECK(named.stages[0].nodes == std::vector<int>{0});  // ordered by first op
  CHECK(rows_of(make_plan(g, named, 5)) == rows_of(before));
}

TEST_CASE("scheduler/replicas: a replicated stage is wired to every replica its routes reach") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  // Stage 0 (tokens, wte, fc) on a0; stage 1 (targets, lm_head, loss) on b0 and b1.
  placement pipeline{{0, 2, 0, 0, 2, 2}};
  placement w = replicate(pipeline, {{{2, 3}, {1.0, 1.0}}}, 4);
  REQUIRE(w.stages.size() == 2);
  CHECK(w.stages[0].nodes == std::vector<int>{0});
  CHECK(w.stages[1].nodes == std::vector<int>{2, 3});
  CHECK(w.stage_of_op == std::vector<int>{0, 1, 0, 0, 1, 1});
  CHECK(w.replicated());
  CHECK(w.replicas(4) == 2);
  CHECK(w.replicas(3) == 1);
  CHECK(w.node_of(5, 1) == 3);
  // Equal weights: micro-batches alternate.
  for (int m = 0; m < 4; ++m) CHECK(w.replica_of(4, m) == m % 2);
  plan p = make_plan(g, w, 1);
  // fc -> lm_head crosses to both replicas; targets -> loss stays inside each replica's node.
  // Then lm_head's gradient ring (the loss has no parameters): b0 -> b1 and b1 -> b0, each hop
  // 2 (R - 1) / R of its 512 parameter bytes per step.
  std::vector<edge_row> want = {
      {1, fwd, 3, 4, 0, 0, 0, 0, 2}, {2, bwd, 3, 4, 0, 0, 0, 2, 0},
      {3, fwd, 3, 4, 0, 0, 1, 0, 3}, {4, bwd, 3, 4, 0, 0, 1, 3, 0},
      {5, red, 4, 4, -1, 0, 1, 2, 3}, {6, red, 4, 4, -1, 1, 0, 3, 2},
  };
  CHECK(rows_of(p) == want);
  CHECK(p.edges[4].bytes_per_micro_batch == 512);
  CHECK_FALSE(p.edges[4].compressible);
  CHECK(p.next_edge_id == 7);
  REQUIRE(p.find_reduce(4, 1) != nullptr);
  CHECK(p.find_reduce(4, 1)->id == 6);
  CHECK(p.find_reduce(5, 0) == nullptr);  // the loss: nothing to sum
  CHECK(p.find_reduce(3, 0) == nullptr);  // fc: one replica
  CHECK(p.find(4, 0, false, 0, 1) == nullptr);  // a ring hop is no data edge
  REQUIRE(p.find(3, 0, true, 0, 1) != nullptr);
  CHECK(p.find(3, 0, true, 0, 1)->to == 3);
  CHECK(p.find(3, 0, true) == &p.edges[0]);
  CHECK(p.find(4, 0, true, 1, 1) == nullptr);  // lm_head -> loss inside one replica
  CHECK(p.replicas_on(3) == std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {5, 1}});
  CHECK(p.ops_on(3) == std::vector<int>{1, 4, 5});

  SUBCASE("routes that never use a replica pair wire no edge for it") {
    // Two replicas on both sides, equal weights: routes (0,0), (1,1), ... join only equal
    // indices, so fc -> lm_head has two pairs, not four.
    placement both = replicate(placement{{0, 2, 0, 0, 2, 2}}, {{{0, 1}, {1, 1}}, {{2, 3}, {1, 1}}}, 4);
    plan q = make_plan(g, both, 1);
    // Then the rings of wte, fc (a0 <-> a1) and lm_head (b0 <-> b1), by op.
    std::vector<edge_row> pairs = {
        {1, fwd, 3, 4, 0, 0, 0, 0, 2},  {2, bwd, 3, 4, 0, 0, 0, 2, 0},  {3, fwd, 3, 4, 0, 1, 1, 1, 3},
        {4, bwd, 3, 4, 0, 1, 1, 3, 1},  {5, red, 2, 2, -1, 0, 1, 0, 1}, {6, red, 2, 2, -1, 1, 0, 1, 0},
        {7, red, 3, 3, -1, 0, 1, 0, 1}, {8, red, 3, 3, -1, 1, 0, 1, 0}, {9, red, 4, 4, -1, 0, 1, 2, 3},
        {10, red, 4, 4, -1, 1, 0, 3, 2},
    };
    CHECK(rows_of(q) == pairs);
    // A ring of three: each hop carries 2 x 2/3 of the op's gradient bytes.
    placement three = replicate(placement{{0, 0, 0, 0, 0, 0}}, {{{0, 1, 2}, {1, 1, 1}}}, 3);
    plan r = make_plan(g, three, 1);
    REQUIRE(r.find_reduce(2, 2) != nullptr);
    CHECK(r.find_reduce(2, 2)->from == 2);
    CHECK(r.find_reduce(2, 2)->to == 0);
    CHECK(r.find_reduce(2, 2)->bytes_per_micro_batch == 512 * 4 / 3);
    CHECK(r.edges.size() == 9);  // three ops with parameters, three hops each, no data edge
    CHECK(format_plan(g, four_nodes(), r).find("reduce  wte -> wte[1]") != std::string::npos);
  }

  SUBCASE("the diff from the pipeline plan lists new replicas, routes and edges") {
    plan before = make_plan(g, pipeline, 1);
    plan after = replan(g, before, w);
    plan_diff d = diff(before, after);
    CHECK(d.moved_ops.empty());
    std::vector<replica_change> want_replicas = {{1, 1, -1, 3}, {4, 1, -1, 3}, {5, 1, -1, 3}};
    CHECK(d.replicas == want_replicas);
    CHECK(d.routes_changed);
    // The edge to replica 0 keeps its id; the edges to replica 1 and lm_head's ring are new.
    CHECK(d.changed.empty());
    REQUIRE(d.added.size() == 4);
    CHECK(d.added[0].consumer_replica == 1);
    CHECK(d.added[2].kind == edge_kind::reduce);
    CHECK(d.added[0].id >= before.next_edge_id);  // numbered after every id the old plan used
    CHECK(d.removed.empty());
    std::string text = format_diff(g, four_nodes(), d);
    CHECK(text.find("lm_head[1]: new -> b1") != std::string::npos);
    CHECK(text.find("micro-batches take other routes") != std::string::npos);
    // And back: the replicas go away.
    plan_diff back = diff(after, replan(g, after, pipeline));
    std::vector<replica_change> gone = {{1, 1, 3, -1}, {4, 1, 3, -1}, {5, 1, 3, -1}};
    CHECK(back.replicas == gone);
    CHECK(back.removed.size() == 4);
  }
}

TEST_CASE("scheduler/replicas: routes are dealt in proportion to the weights, deterministically") {
  std::vector<stage_replicas> stages = {{{0, 1}, {3.0, 1.0}}, {{2, 3, 4}, {1.0, 1.0, 1.0}}, {{5}, {2.0}}};
  auto routes = deal_routes(stages, 8);
  REQUIRE(routes.size() == 8);
  CHECK(routes == deal_routes(stages, 8));
  std::vector<int> first, second;
  for (auto& r : routes) {
    first.push_back(r[0]);
    second.push_back(r[1]);
    CHECK(r[2] == 0);
  }
  // 3 : 1 of 8 is 6 : 2, spread (not 6 in a row).
  CHECK(first == std::vector<int>{0, 0, 1, 0, 0, 0, 1, 0});
  // 8 over three equal replicas: 3, 3, 2 (largest remainder, ties to the lower replica).
  CHECK(std::count(second.begin(), second.end(), 0) == 3);
  CHECK(std::count(second.begin(), second.end(), 1) == 3);
  CHECK(std::count(second.begin(), second.end(), 2) == 2);
  CHECK(second == std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1});
  // Proportional over many micro-batches, for uneven weights.
  auto many = deal_routes({{{0, 1, 2}, {5.0, 3.0, 2.0}}}, 100);
  std::vector<int> count(3, 0);
  for (auto& r : many) ++count[r[0]];
  CHECK(count == std::vector<int>{50, 30, 20});
  CHECK_THROWS_AS(deal_routes({{{0, 1}, {1.0, 0.0}}}, 4), std::invalid_argument);
  CHECK_THROWS_AS(deal_routes({{{0}, {1.0}}}, 0), std::invalid_argument);
}

TEST_CASE("scheduler/replicas: replicate refuses replica sets that cannot work") {
  placement pipeline{{0, 2, 0, 0, 2, 2}};
  CHECK_THROWS_AS(replicate(pipeline, {{{2, 2}, {1, 1}}}, 4), std::invalid_argument);          // node twice
  CHECK_THROWS_AS(replicate(pipeline, {{{2, 3}, {1, 1}}, {{0, 3}, {1, 1}}}, 4), std::invalid_argument);  // two stages
  CHECK_THROWS_AS(replicate(pipeline, {{{2, 0}, {1, 1}}}, 4), std::invalid_argument);          // holds other ops
  CHECK_THROWS_AS(replicate(pipeline, {{{1, 3}, {1, 1}}}, 4), std::invalid_argument);          // first node idle
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  placement broken = replicate(pipeline, {{{2, 3}, {1, 1}}}, 4);
  broken.routes[1][1] = 2;  // a replica that does not exist
  CHECK_THROWS_AS(make_plan(g, broken), std::invalid_argument);
}

TEST_CASE("scheduler/replicas: two replicas of a stage take half the compute plus the all-reduce") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = four_nodes();
  estimator_options o;
  o.local_rtt_s = 0;
  o.coordinator_rtt_s = 0.1;
  // 512 bytes (wte's or lm_head's gradient) take 1 s between the sites.
  const double mbit = 512 * 8 / 1e6;
  workload_estimator est(g, c, chain_timed_profile(g, c, 4, mbit), o);
  placement one{std::vector<int>(6, 0)};
  step_estimate alone = est.simulate(make_plan(g, one));
  // One node: 4 micro-batches x (2 + 3 + 4 + 2) s, updates 2 s, three round trips.
  CHECK(alone.pipeline_s == doctest::Approx(44));
  CHECK(alone.step_s == doctest::Approx(46.3));
  CHECK(alone.allreduce_bytes == 0);

  // The whole model on a0 and b0 (equal nodes, 1 s per 512 bytes between them).
  plan two = make_plan(g, replicate(one, {{{0, 2}, {1, 1}}}, 4));
  // Each replica holds every op: nothing crosses during the pipeline, only the gradient rings
  // of the three ops with parameters (two hops each).
  CHECK(two.edges.size() == 6);
  for (auto& e : two.edges) CHECK(e.kind == edge_kind::reduce);
  step_estimate s = est.simulate(two);
  CHECK(s.feed_interval_s == 0);
  // Each node runs 2 micro-batches: 22 s. The all-reduces of lm_head (done long before) and fc
  // (0.5 s from 21 s) hide under the backward; wte's (1 s from 22 s) is exposed.
  CHECK(s.node_compute_s[0] == doctest::Approx(22 + 2));
  CHECK(s.node_compute_s[2] == doctest::Approx(22 + 2));
  CHECK(s.allreduce_exposed_s == doctest::Approx(1));
  CHECK(s.pipeline_s == doctest::Approx(23));
  CHECK(s.step_s == doctest::Approx(25.3));
  // Ring of two: each link carries every op's gradient once, 512 + 256 + 512 bytes.
  CHECK(s.allreduce_bytes == doctest::Approx(2 * 1280));
  CHECK(s.allreduce_s == doctest::Approx(2.5));
  // About half of one node's compute plus the exposed all-reduce.
  CHECK(s.pipeline_s == doctest::Approx(alone.pipeline_s / 2 + s.allreduce_exposed_s));
  // Every replica holds the parameters but only its micro-batches' activations.
  CHECK(s.node_memory_bytes[0] < alone.node_memory_bytes[0]);

  SUBCASE("a pipeline stage feeding a replicated stage") {
    placement w = replicate(placement{{0, 2, 0, 0, 2, 2}}, {{{2, 3}, {1, 1}}}, 4);
    step_estimate r = est.simulate(make_plan(g, w));
    step_estimate p = est.simulate(make_plan(g, placement{{0, 2, 0, 0, 2, 2}}));
    // b0 and b1 share the second stage: each runs lm_head and loss for two micro-batches.
    CHECK(r.node_compute_s[2] == doctest::Approx(2 * 6 + 1));
    CHECK(r.node_compute_s[3] == doctest::Approx(2 * 6 + 1));
    CHECK(r.node_compute_s[0] == doctest::Approx(p.node_compute_s[0]));
    // The pace is the slower stage's: a0's 2 s per micro-batch (b0 and b1 take one every 1.5 s).
    CHECK(r.feed_interval_s == doctest::Approx(2));
    CHECK(r.allreduce_bytes == doctest::Approx(2 * 512));
    CHECK(r.step_s > 0);
  }
}


TEST_CASE("scheduler/replicas: a change of placement names what it moves, adds and drops") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = four_nodes();
  // Stage 0 (tokens, wte, fc) on a0; stage 1 (targets, lm_head, loss) on b0 and b1.
  placement pipeline{{0, 2, 0, 0, 2, 2}};
  placement two = replicate(pipeline, {{{2, 3}, {1.0, 1.0}}}, 4);
  CHECK(same_placement(two, two));
  CHECK_FALSE(same_placement(pipeline, two));
  CHECK(changed_ops(pipeline, two) == std::vector<int>{1, 4, 5});
  // Replica 1 of targets, lm_head and loss arrives on b1; nothing else needs a state.
  CHECK(arriving_replicas(pipeline, two) == std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {5, 1}});
  CHECK(arriving_replicas(two, pipeline).empty());  // dropping a replica spawns nothing
  // Other weights deal other routes over the same nodes: not the same placement, no op changes.
  placement skewed = replicate(pipeline, {{{2, 3}, {3.0, 1.0}}}, 4);
  CHECK(changed_ops(two, skewed).empty());
  CHECK_FALSE(same_placement(two, skewed));

  // move: lm_head's stage keeps its replicas when some of its ops leave; ops moved onto a
  // stage's first node join that stage; a later replica's node takes no ops.
  placement moved = move_ops(g, c, two, {3}, 2, 4);  // fc onto b0, stage 1's first node
  CHECK(moved.stage_of(3) == moved.stage_of(4));
  CHECK(moved.replicas(3) == 2);
  CHECK(arriving_replicas(two, moved) == std::vector<std::pair<int, int>>{{3, 0}, {3, 1}});
  try {
    move_ops(g, c, two, {3}, 3, 4);
    FAIL("moved onto a replica's node");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("node 'b1' holds replica 1 of the stage of lm_head .. loss") == 0);
  }
  // All of a replicated stage's ops leave its first node: the stage ends, replicas with it.
  placement gone = move_ops(g, c, two, {1, 4, 5}, 1, 4);
  CHECK_FALSE(gone.replicated());
  CHECK(gone.node_of_op == std::vector<int>{0, 1, 0, 0, 1, 1});

  // set_stage_replicas: add, drop, move replicas of a stage.
  placement three = set_stage_replicas(g, c, two, 4, {2, 3, 1}, 4);
  CHECK(three.replicas(4) == 3);
  CHECK(three.stages[three.stage_of(4)].weights == std::vector<double>{1, 1, 1});
  CHECK(arriving_replicas(two, three) == std::vector<std::pair<int, int>>{{1, 2}, {4, 2}, {5, 2}});
  placement back = set_stage_replicas(g, c, three, 5, {2}, 4);
  CHECK(same_placement(back, pipeline));  // one replica left: the pipeline again
  CHECK(changed_ops(back, pipeline).empty());
  // The first node changes: the stage's ops move there.
  placement elsewhere = set_stage_replicas(g, c, two, 4, {1, 3}, 4);
  CHECK(elsewhere.node_of_op == std::vector<int>{0, 1, 0, 0, 1, 1});
  CHECK(elsewhere.node_of(4, 1) == 3);
  // Replicating a pipeline's stage: every op on the op's node.
  placement from_pipeline = set_stage_replicas(g, c, pipeline, 3, {0, 1}, 4);
  CHECK(from_pipeline.replicas(2) == 2);
  CHECK(from_pipeline.replicas(4) == 1);
  auto refused = [&](const placement& p, int op, std::vector<int> nodes) {
    try {
      set_stage_replicas(g, c, p, op, nodes, 4);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refused(two, 4, {}) == "a stage needs at least one node");
  CHECK(refused(two, 4, {2, 2}) == "node 'b0' is named twice");
  CHECK(refused(two, 4, {2, 0}).find("node 'a0' already holds ops of another stage (wte .. fc)") == 0);
  CHECK(refused(two, 3, {0, 3}).find("node 'b1' already holds replica 1 of the ops of another stage") == 0);
}

}  // namespace
}  // namespace fusion
