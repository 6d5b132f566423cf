// Fan-out nodes: the loader puts an identity node between an op and its several consumers, and
// placement puts it with them, so a pipeline cut through a residual stream carries the tensor once
// (core/graph_build.cpp, place_fanouts in scheduler/placement.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

// gpt-char-tiny: 2 blocks, so wpe, h0.res1, h0.res2 and h1.res1 have two readers each.
graph tiny() { return load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 2); }

// Every op up to and including `last` (graph order) on node 0, the rest on node 1, inputs with
// their first reader; fan-out nodes on the side of the op they follow, as a placer that does not
// know them would leave them.
placement split_after(const graph& g, const std::string& last) {
  const int cut = g.find(last);
  REQUIRE(cut >= 0);
  placement p;
  for (auto& n : g.nodes) p.node_of_op.push_back(n.id <= cut || (n.fanout && n.inputs[0] <= cut) ? 0 : 1);
  place_inputs(g, p, std::vector<bool>(g.nodes.size(), false));  // targets go with the loss
  return p;
}

std::vector<const plan_edge*> forward_edges(const plan& p) {
  std::vector<const plan_edge*> out;
  for (auto& e : p.edges)
    if (e.kind == edge_kind::forward) out.push_back(&e);
  return out;
}

TEST_CASE("scheduler/fanout: the loader puts an identity node after every op with several readers") {
  const graph g = tiny();
  int fans = 0;
  for (auto& n : g.nodes) {
    if (!n.fanout) {
      // Only data inputs and fan-out nodes may have several readers now.
      if (!n.is_input()) CHECK_MESSAGE(n.consumers.size() <= 1, n.name);
      continue;
    }
    ++fans;
    CHECK(n.kind == "identity");
    REQUIRE(n.inputs.size() == 1);
    const graph_node& producer = g.nodes[n.inputs[0]];
    CHECK(n.name == producer.name + ".fan");
    CHECK(n.id == producer.id + 1);  // right after its op in graph order
    CHECK(n.shape == producer.shape);
    REQUIRE(producer.consumers.size() == 1);
    CHECK(producer.consumers[0].node == n.id);
    CHECK(n.consumers.size() >= 2);
  }
  CHECK(fans == 4);  // wpe, h0.res1, h0.res2, h1.res1
  // The readers keep their order (it orders the gradient sum) and their slots.
  const graph_node& f = g.nodes[g.find("h0.res1.fan")];
  REQUIRE(f.consumers.size() == 2);
  CHECK(f.consumers[0].node == g.find("h0.ln2"));
  CHECK(f.consumers[0].slot == 0);
  CHECK(f.consumers[1].node == g.find("h0.res2"));
  CHECK(f.consumers[1].slot == 0);
  CHECK(g.nodes[g.find("h0.res2")].inputs == std::vector<int>{f.id, g.find("h0.fc2")});
  CHECK(g.param_count() == load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 2).param_count());
}

TEST_CASE("scheduler/fanout: a cut through the residual stream carries its tensor once each way") {
  const graph g = tiny();
  const int res1 = g.find("h0.res1"), fan = g.find("h0.res1.fan");
  // The placer left the fan-out node with its op; the plan moves it to the readers.
  const placement before = split_after(g, "h0.res1");
  REQUIRE(before.node_of_op[fan] == 0);
  const plan p = make_plan(g, before);
  CHECK(p.where.node_of_op[fan] == 1);
  const auto fwd = forward_edges(p);
  REQUIRE(fwd.size() == 1);
  CHECK(fwd[0]->producer == res1);
  CHECK(fwd[0]->consumer == fan);
  CHECK(fwd[0]->bytes_per_micro_batch == static_cast<uint64_t>(numel_of(g.nodes[res1].shape)) * 4);
  CHECK(p.edges.size() == 2);  // and one gradient back
  // Applying it again changes nothing.
  CHECK(place_fanouts(g, p.where).node_of_op == p.where.node_of_op);

  // Readers on two nodes: the fan-out node stays, each reader gets the tensor over its own edge.
  placement split = split_after(g, "h0.ln2");
  split.node_of_op[fan] = 0;
  const plan q = make_plan(g, split);
  CHECK(q.where.node_of_op[fan] == 0);
  int from_fan = 0;
  for (auto* e : forward_edges(q)) from_fan += e->producer == fan;
  CHECK(from_fan == 1);  // to h0.res2 on node 1; h0.ln2 shares node 0
}

TEST_CASE("scheduler/fanout: with stage replicas the fan-out node joins its readers' stage") {
  const graph g = tiny();
  const int fan = g.find("h0.res1.fan");
  stage_replicas readers;
  readers.nodes = {1, 2};
  readers.weights = {1, 1};
  const placement staged = replicate(split_after(g, "h0.res1"), {readers}, 4);
  REQUIRE(staged.stage_of(fan) != staged.stage_of(g.find("h0.ln2")));
  const plan p = make_plan(g, staged);
  CHECK(p.where.stage_of(fan) == p.where.stage_of(g.find("h0.ln2")));
  CHECK(p.where.node_of(fan, 0) == 1);
  CHECK(p.where.node_of(fan, 1) == 2);
  // Each replica of the readers' stage gets the tensor once from the producer.
  for (auto* e : forward_edges(p)) CHECK(e->producer == g.find("h0.res1"));
}

TEST_CASE("scheduler/fanout: explicit placements need not name fan-out nodes") {
  const graph g = tiny();
  cluster_spec c = parse_cluster(
      "name: \"two\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
      "node { name: \"a1\" site: \"a\" }\nnode { name: \"b1\" site: \"b\" }\n"
      "link { a: \"a\" b: \"b\" mbit: 100 }\n"
      "placement { policy: \"explicit\"\n"
      "  assign { node: \"a1\" ops: \"wte\" ops: \"wpe\" ops: \"h0.*\" }\n"
      "  assign { node: \"b1\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" } }\n",
      "two.pbtxt");
  const placement p = place_ops(g, c);
  CHECK(p.node_of_op[g.find("wpe.fan")] == 0);     // named by no pattern: with wpe, and its readers
  CHECK(p.node_of_op[g.find("h0.res2.fan")] == 1);  // "h0.*" put it on a1, its readers are on b1
  CHECK(forward_edges(make_plan(g, p)).size() == 1);
}

}  // namespace
}  // namespace fusion
