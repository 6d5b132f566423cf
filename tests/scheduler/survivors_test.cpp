// Re-planning on the survivors of a node loss (scheduler/survivors.hpp): the same policy as at
// start on the nodes left, in the whole cluster's node indices; explicit plans keep what they can
// (a lost replica dropped, a lost first node replaced by its replica) and fall back to OP-Fence.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/survivors.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

// Nodes n0..n{n-1} on one site, then the placement section.
cluster_spec cluster_of(int n, const std::string& placement) {
  std::string text = "name: \"c\"\nsite { name: \"s\" }\n";
  for (int i = 0; i < n; ++i) text += "node { name: \"n" + std::to_string(i) + "\" site: \"s\" }\n";
  return parse_cluster(text + placement, "c.pbtxt");
}

survivor_placement replan(const graph& g, const cluster_spec& c, std::vector<bool> alive) {
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = 4;
  return place_on_survivors(g, c, p, alive, compression_config{});
}

bool uses(const placement& w, int node) {
  for (size_t op = 0; op < w.node_of_op.size(); ++op)
    for (int r = 0; r < w.replicas(static_cast<int>(op)); ++r)
      if (w.node_of(static_cast<int>(op), r) == node) return true;
  return false;
}

const std::string assign_two = "placement { policy: \"explicit\" "
                               "assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" ops: \"h0.*\" } "
                               "assign { node: \"n1\" replica: \"n2\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" "
                               "ops: \"loss\" } }";

}  // namespace

TEST_CASE("survivors: even re-plans on the nodes left as a fresh run of those nodes would") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  auto got = replan(g, cluster_of(3, "placement { policy: \"even\" }"), {true, false, true});
  CHECK(got.note.empty());
  CHECK(!uses(got.where, 1));
  // n0 and n2 of three are n0 and n1 of a two-node cluster: stage for stage the same split.
  auto two = place_ops(g, cluster_of(2, "placement { policy: \"even\" }"));
  REQUIRE(two.node_of_op.size() == got.where.node_of_op.size());
  for (size_t op = 0; op < two.node_of_op.size(); ++op)
    CHECK(got.where.node_of_op[op] == (two.node_of_op[op] == 0 ? 0 : 2));
}

TEST_CASE("survivors: an explicit plan drops a lost replica, or hands a lost first node's ops to its replica") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  auto c = cluster_of(3, assign_two);
  auto before = place_ops(g, c);
  REQUIRE(before.replicated());

  auto replica_lost = replan(g, c, {true, true, false});
  CHECK(!replica_lost.where.replicated());
  CHECK(replica_lost.note.find("replica on lost node 'n2' dropped") != std::string::npos);
  CHECK(replica_lost.where.node_of_op == before.node_of_op);  // every op where replica 0 was

  auto first_lost = replan(g, c, {true, false, true});
  CHECK(!first_lost.where.replicated());
  CHECK(first_lost.note.find("the ops of lost node 'n1' stay on their replica 'n2'") != std::string::npos);
  for (size_t op = 0; op < before.node_of_op.size(); ++op)
    CHECK(first_lost.where.node_of_op[op] == (before.node_of_op[op] == 1 ? 2 : before.node_of_op[op]));
}

TEST_CASE("survivors: an explicit plan whose lost node has no replica falls back to OP-Fence, saying so") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  auto got = replan(g, cluster_of(3, assign_two), {false, true, true});
  CHECK(got.note.find("puts ops on lost node 'n0' with no surviving replica: re-planned with OP-Fence") !=
        std::string::npos);
  CHECK(!uses(got.where, 0));
  CHECK(std::all_of(got.where.node_of_op.begin(), got.where.node_of_op.end(), [](int n) { return n == 1 || n == 2; }));
}

TEST_CASE("survivors: no node left is an error naming the cluster file") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  std::string error;
  try {
    replan(g, cluster_of(2, "placement { policy: \"even\" }"), {false, false});
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK(error == "no node of c.pbtxt is left to train on");
}

TEST_CASE("survivors: the scheduler's re-plan uses only the nodes that can take work, with what was measured") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  cluster_spec c = cluster_of(3, "");
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = 4;
  workload_estimator est(g, c, p);
  const int fc = g.find("h0.fc");
  REQUIRE(fc >= 0);
  // n0 measured as profiled, n2 a hundred times slower: with n1 out, n0 takes the heavy ops.
  const workload_estimator profiled(g, c, p);
  for (auto& n : g.nodes)
    if (!n.is_input()) {
      est.observe_op(n.id, 0, profiled.forward_s(n.id, 0), profiled.backward_s(n.id, 0));
      est.observe_op(n.id, 2, 100 * profiled.forward_s(n.id, 2), 100 * profiled.backward_s(n.id, 2));
    }
  const placement w = place_on_usable(est, {true, false, true}, compression_config{});
  CHECK(!uses(w, 1));
  CHECK(uses(w, 0));
  CHECK(w.node_of_op[fc] == 0);
  CHECK(w.node_of_op[g.find("h1.fc")] == 0);
  // Without measurements both usable nodes are alike and n1 still gets nothing.
  workload_estimator fresh(g, c, p);
  CHECK(!uses(place_on_usable(fresh, {true, false, true}, compression_config{}), 1));
  CHECK_THROWS_WITH(place_on_usable(fresh, {false, false, false}, compression_config{}),
                    "no node of c.pbtxt can take work");
}

}  // namespace fusion
