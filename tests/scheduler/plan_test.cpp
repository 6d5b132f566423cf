// Plan tests: the profile a cluster file implies, wiring placements into cross-node edges (ids,
// directions, bytes), lookups, renumbering, diffs (checked by hand on a four-op model) and the
// printed forms.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

const char* tiny = "configs/models/gpt-char-tiny.pbtxt";

// Four ops small enough to wire by hand. Graph node ids: tokens 0, targets 1, wte 2, lm_head 3,
// loss 4. Consumers: tokens -> wte, targets -> loss (slot 1), wte -> lm_head, lm_head -> loss.
const char* four_ops = R"(name: "four"
const { name: "V" value: 8 }
const { name: "T" value: 4 }
const { name: "C" value: 6 }
input { name: "tokens"  shape: "B,T" dtype: I32 }
input { name: "targets" shape: "B,T" dtype: I32 }
node { name: "wte" op: "token_embedding" in: "tokens" attr { key: "vocab" value: "V" } attr { key: "dim" value: "C" } }
node { name: "lm_head" op: "linear" in: "wte" attr { key: "out" value: "V" } attr { key: "bias" value: "false" } }
node { name: "loss" op: "cross_entropy" in: "lm_head" in: "targets" }
tokens: "tokens"  targets: "targets"  logits: "lm_head"  loss: "loss"
)";

cluster_spec two_nodes() {
  return parse_cluster("name: \"two\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
                       "node { name: \"a1\" site: \"a\" }\nnode { name: \"b1\" site: \"b\" }\n"
                       "link { a: \"a\" b: \"b\" mbit: 100 }\n",
                       "two.pbtxt");
}

placement placed(std::vector<int> nodes) { return placement{std::move(nodes)}; }

uint64_t numel_u(const shape_t& s) { return static_cast<uint64_t>(numel_of(s)); }

TEST_CASE("scheduler/plan: profile_from_cluster mirrors the cluster file") {
  cluster_spec c = load_cluster(src("configs/clusters/sites-3.pbtxt"));
  cluster_profile p = profile_from_cluster(c);
  REQUIRE(p.nodes.size() == c.nodes.size());
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    CHECK(p.nodes[i].name == c.nodes[i].name);
    CHECK(p.nodes[i].site == c.nodes[i].site);
    CHECK(p.nodes[i].device == c.nodes[i].device);
    CHECK(p.nodes[i].gflops == 0);
    CHECK(p.nodes[i].memory_bytes == 0);
  }
  REQUIRE(p.links.size() == c.links.size());
  REQUIRE(!c.links.empty());
  for (size_t i = 0; i < c.links.size(); ++i) {
    REQUIRE(p.links[i].site_a >= 0);
    REQUIRE(p.links[i].site_b >= 0);
    CHECK(c.sites[p.links[i].site_a].name == c.links[i].a);
    CHECK(c.sites[p.links[i].site_b].name == c.links[i].b);
    CHECK(p.links[i].mbit == c.links[i].mbit);
    CHECK(p.links[i].rtt_s == 0);
  }
  // The placement with an explicit profile is the placement without one.
  graph g = load_graph(src(tiny), 2);
  CHECK(place_ops(g, c, p).node_of_op == place_ops(g, c).node_of_op);
}

TEST_CASE("scheduler/plan: a one-node placement has no edges") {
  graph g = load_graph(src(tiny), 2);
  plan p = make_plan(g, placed(std::vector<int>(g.nodes.size(), 0)), 7);
  CHECK(p.edges.empty());
  CHECK(p.next_edge_id == 7);
  CHECK(p.ops_on(0).size() == g.nodes.size());
  CHECK(p.find(7) == nullptr);
  CHECK(p.find(g.find("wte"), 0, true) == nullptr);
  CHECK(format_plan(g, load_cluster(src("configs/clusters/local-2.pbtxt")), p).find("edges: none") !=
        std::string::npos);
}

TEST_CASE("scheduler/plan: an even placement on 3 nodes wires every crossing") {
  const int64_t micro_batch = 4;
  graph g = load_graph(src(tiny), micro_batch);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  const uint64_t first = 100;
  plan p = plan_run(g, c, profile_from_cluster(c), first);
  CHECK(p.where.node_of_op == place_ops(g, c).node_of_op);

  // Walk the graph independently: two edges per crossing, in (producer, consumer_index) order.
  size_t k = 0;
  int crossings = 0;
  for (auto& n : g.nodes)
    for (size_t i = 0; i < n.consumers.size(); ++i) {
      int a = p.where.node_of_op[n.id], b = p.where.node_of_op[n.consumers[i].node];
      if (a == b) continue;
      ++crossings;
      INFO(n.name << " -> " << g.nodes[n.consumers[i].node].name);
      REQUIRE(k + 1 < p.edges.size());
      const plan_edge& f = p.edges[k];
      const plan_edge& r = p.edges[k + 1];
      CHECK(f.id == first + k);
      CHECK(r.id == first + k + 1);
      CHECK(f.forward());
      CHECK_FALSE(r.forward());
      for (const plan_edge* e : {&f, &r}) {
        CHECK(e->producer == n.id);
        CHECK(e->consumer == n.consumers[i].node);
        CHECK(e->slot == n.consumers[i].slot);
        CHECK(e->consumer_index == static_cast<int>(i));
      }
      CHECK(f.from == a);
      CHECK(f.to == b);
      CHECK(r.from == b);
      CHECK(r.to == a);
      CHECK(f.bytes_per_micro_batch == numel_u(n.shape) * dtype_size(n.type));
      CHECK(r.bytes_per_micro_batch == (n.is_input() ? 0 : numel_u(n.shape) * 4));
      CHECK(f.setting == edge_setting{});
      k += 2;
    }
  CHECK(k == p.edges.size());
  CHECK(crossings >= 2);  // three stages: at least one crossing between each pair of neighbours
  CHECK(p.next_edge_id == first + p.edges.size());

  // By hand: the residual stream between blocks is (B, T, C) = (4, 64, 64) floats = 64 KiB per
  // micro-batch, in both directions.
  bool residual = false;
  for (auto& e : p.edges)
    if (g.nodes[e.producer].name.find("res") != std::string::npos) {
      CHECK(e.bytes_per_micro_batch == 4 * 64 * 64 * 4);
      residual = true;
    }
  CHECK(residual);
}

TEST_CASE("scheduler/plan: find by id and by key, ops_on") {
  graph g = load_graph(src(tiny), 2);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  plan p = plan_run(g, c, profile_from_cluster(c), 1);
  REQUIRE(!p.edges.empty());
  for (auto& e : p.edges) {
    const plan_edge* by_id = p.find(e.id);
    REQUIRE(by_id != nullptr);
    CHECK(by_id == &e);
    const plan_edge* by_key = p.find(e.producer, e.consumer_index, e.forward());
    REQUIRE(by_key != nullptr);
    CHECK(by_key == &e);
  }
  CHECK(p.find(uint64_t{0}) == nullptr);
  CHECK(p.find(p.next_edge_id) == nullptr);
  CHECK(p.find(-1, 0, true) == nullptr);

  std::set<int> seen;
  for (int node = 0; node < 3; ++node) {
    auto ops = p.ops_on(node);
    CHECK(!ops.empty());
    for (int op : ops) {
      CHECK(p.where.node_of_op[op] == node);
      CHECK(seen.insert(op).second);
    }
  }
  CHECK(seen.size() == g.nodes.size());
  CHECK(p.ops_on(3).empty());
}

TEST_CASE("scheduler/plan: renumber keeps everything but the ids") {
  graph g = load_graph(src(tiny), 2);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  plan p = plan_run(g, c, profile_from_cluster(c), 1);
  plan q = renumber(p, p.next_edge_id);
  CHECK(q.where.node_of_op == p.where.node_of_op);
  REQUIRE(q.edges.size() == p.edges.size());
  for (size_t i = 0; i < p.edges.size(); ++i) {
    CHECK(q.edges[i].id == p.next_edge_id + i);
    plan_edge same = q.edges[i];
    same.id = p.edges[i].id;
    CHECK(std::tie(same.id, same.kind, same.producer, same.consumer, same.slot, same.consumer_index, same.from,
                   same.to, same.bytes_per_micro_batch) ==
          std::tie(p.edges[i].id, p.edges[i].kind, p.edges[i].producer, p.edges[i].consumer, p.edges[i].slot,
                   p.edges[i].consumer_index, p.edges[i].from, p.edges[i].to, p.edges[i].bytes_per_micro_batch));
    CHECK(same.setting == p.edges[i].setting);
  }
  CHECK(q.next_edge_id == p.next_edge_id + p.edges.size());
}

TEST_CASE("scheduler/plan: diff of a plan with itself and with its renumbering") {
  graph g = load_graph(src(tiny), 2);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  plan p = plan_run(g, c, profile_from_cluster(c), 1);
  plan_diff same = diff(p, p);
  CHECK(same.empty());
  CHECK(format_diff(g, c, same) == "no change");

  plan q = renumber(p, p.next_edge_id);
  plan_diff d = diff(p, q);
  CHECK_FALSE(d.empty());
  CHECK(d.moved_ops.empty());
  CHECK(d.added.empty());
  CHECK(d.removed.empty());
  REQUIRE(d.changed.size() == p.edges.size());
  for (size_t i = 0; i < p.edges.size(); ++i) {
    CHECK(d.changed[i].first.id == p.edges[i].id);   // in plan order
    CHECK(d.changed[i].second.id == q.edges[i].id);
  }
  CHECK(format_diff(g, c, d).find(std::to_string(p.edges.size()) + " edges changed") != std::string::npos);

  // A new codec on one direction, same id: changed, nothing else.
  plan r = p;
  r.edges[1].setting.kind = codec_kind::topk;
  r.edges[1].setting.keep_ratio = 0.25;
  plan_diff s = diff(p, r);
  REQUIRE(s.changed.size() == 1);
  CHECK(s.changed[0].first.id == p.edges[1].id);
  CHECK(s.changed[0].second.setting.kind == codec_kind::topk);
  CHECK(s.moved_ops.empty());
  CHECK(s.added.empty());
  CHECK(s.removed.empty());
  CHECK(format_diff(g, c, s).find("codec none -> topk 25% f16") != std::string::npos);
}

TEST_CASE("scheduler/plan: wiring and diffs of a four-op model, by hand") {
  const int64_t b = 2;
  graph g = parse_graph(four_ops, "four.pbtxt", b);
  REQUIRE(g.nodes.size() == 5);
  const int tokens = 0, targets = 1, wte = 2, lm_head = 3, loss = 4;
  REQUIRE(g.find("tokens") == tokens);
  REQUIRE(g.find("targets") == targets);
  REQUIRE(g.find("wte") == wte);
  REQUIRE(g.find("lm_head") == lm_head);
  REQUIRE(g.find("loss") == loss);
  cluster_spec c = two_nodes();

  // A: the embedding on a1, the head and the loss on b1: one crossing, wte -> lm_head.
  plan a = make_plan(g, placed({0, 1, 0, 1, 1}), 1);
  REQUIRE(a.edges.size() == 2);
  CHECK(a.edges[0].id == 1);
  CHECK(a.edges[0].forward());
  CHECK(a.edges[0].producer == wte);
  CHECK(a.edges[0].consumer == lm_head);
  CHECK(a.edges[0].from == 0);
  CHECK(a.edges[0].to == 1);
  CHECK(a.edges[0].bytes_per_micro_batch == 2 * 4 * 6 * 4);  // (B, T, C) f32
  CHECK(a.edges[1].id == 2);
  CHECK_FALSE(a.edges[1].forward());
  CHECK(a.edges[1].from == 1);
  CHECK(a.edges[1].to == 0);
  CHECK(a.edges[1].bytes_per_micro_batch == 2 * 4 * 6 * 4);
  CHECK(a.next_edge_id == 3);
  CHECK(a.ops_on(0) == std::vector<int>{tokens, wte});
  CHECK(a.ops_on(1) == std::vector<int>{targets, lm_head, loss});

  // B: lm_head moves to a1, so the crossing becomes lm_head -> loss.
  plan pb = make_plan(g, placed({0, 1, 0, 0, 1}), a.next_edge_id);
  REQUIRE(pb.edges.size() == 2);
  CHECK(pb.edges[0].producer == lm_head);
  CHECK(pb.edges[0].bytes_per_micro_batch == 2 * 4 * 8 * 4);  // (B, T, V) f32 logits
  plan_diff d = diff(a, pb);
  CHECK(d.moved_ops == std::vector<int>{lm_head});
  CHECK(d.moves == std::vector<std::pair<int, int>>{{1, 0}});
  REQUIRE(d.removed.size() == 2);
  CHECK(d.removed[0].id == 1);
  CHECK(d.removed[1].id == 2);
  REQUIRE(d.added.size() == 2);
  CHECK(d.added[0].id == 3);
  CHECK(d.added[0].forward());
  CHECK(d.added[0].producer == lm_head);
  CHECK(d.added[0].consumer == loss);
  CHECK(d.added[1].id == 4);
  CHECK_FALSE(d.added[1].forward());
  CHECK(d.changed.empty());
  std::string text = format_diff(g, c, d);
  INFO(text);
  CHECK(text.find("1 op moves (lm_head: b1 -> a1)") != std::string::npos);
  CHECK(text.find("2 edges added (#3 fwd lm_head -> loss (a1 -> b1), #4 bwd lm_head -> loss (b1 -> a1))") !=
        std::string::npos);
  CHECK(text.find("2 edges removed (#1 fwd wte -> lm_head (a1 -> b1), #2 bwd wte -> lm_head (b1 -> a1))") !=
        std::string::npos);

  // C: tokens and wte go to b1, lm_head to a1: wte -> lm_head keeps its key but flips its ends
  // (removed + added), lm_head -> loss is new, and the targets stay put.
  plan pc = make_plan(g, placed({1, 1, 1, 0, 1}), 10);
  plan_diff e = diff(a, pc);
  CHECK(e.moved_ops == std::vector<int>{tokens, wte, lm_head});
  CHECK(e.moves == std::vector<std::pair<int, int>>{{0, 1}, {0, 1}, {1, 0}});
  REQUIRE(e.removed.size() == 2);
  CHECK(e.removed[0].id == 1);
  CHECK(e.removed[1].id == 2);
  REQUIRE(e.added.size() == 4);
  CHECK(e.added[0].producer == wte);
  CHECK(e.added[0].forward());
  CHECK(e.added[0].from == 1);
  CHECK(e.added[0].to == 0);
  CHECK(e.added[1].producer == wte);
  CHECK_FALSE(e.added[1].forward());
  CHECK(e.added[2].producer == lm_head);
  CHECK(e.added[2].forward());
  CHECK(e.added[3].producer == lm_head);
  CHECK_FALSE(e.added[3].forward());
  CHECK(e.changed.empty());

  // D: targets away from the loss: the input's forward carries (B, T) int32, its backward nothing.
  plan pd = make_plan(g, placed({0, 0, 0, 0, 1}), 1);
  const plan_edge* tf = pd.find(targets, 0, true);
  const plan_edge* tb = pd.find(targets, 0, false);
  REQUIRE(tf != nullptr);
  REQUIRE(tb != nullptr);
  CHECK(tf->slot == 1);
  CHECK(tf->bytes_per_micro_batch == 2 * 4 * 4);
  CHECK(tb->bytes_per_micro_batch == 0);
  CHECK(tb->id == tf->id + 1);
  // Edges follow producer id order: targets (1) before lm_head (3).
  CHECK(pd.edges.front().producer == targets);
  CHECK(pd.edges.back().producer == lm_head);
}

TEST_CASE("scheduler/plan: replan keeps the edges whose ends stay and renews the others") {
  graph g = parse_graph(four_ops, "four.pbtxt", 2);
  const int wte = 2, lm_head = 3, loss = 4;
  // wte on a1, lm_head and loss on b1; the crossing wte -> lm_head compressed.
  plan a = make_plan(g, placed({0, 1, 0, 1, 1}), 1);
  a.edges[0].setting.kind = codec_kind::topk;
  a.edges[0].setting.keep_ratio = 0.25;
  // The targets input moves to a1: wte -> lm_head keeps its ends, targets -> loss is new.
  plan b = replan(g, a, placed({0, 0, 0, 1, 1}));
  plan_diff d = diff(a, b);
  CHECK(d.moved_ops == std::vector<int>{1});
  CHECK(d.removed.empty());
  CHECK(d.changed.empty());
  REQUIRE(d.added.size() == 2);
  CHECK(d.added[0].producer == 1);
  CHECK(d.added[0].id >= a.next_edge_id);
  const plan_edge* kept = b.find(wte, 0, true);
  REQUIRE(kept != nullptr);
  CHECK(kept->id == a.edges[0].id);
  CHECK(kept->setting.keep_ratio == 0.25);
  // lm_head moves to a1: wte -> lm_head becomes local, lm_head -> loss remote.
  plan c = replan(g, b, placed({0, 0, 0, 0, 1}));
  plan_diff e = diff(b, c);
  CHECK(e.moved_ops == std::vector<int>{lm_head});
  CHECK(e.removed.size() == 2);
  REQUIRE(e.added.size() == 2);
  CHECK(e.added[0].producer == lm_head);
  CHECK(e.added[0].consumer == loss);
  CHECK(c.find(wte, 0, true) == nullptr);
  CHECK(c.next_edge_id > b.next_edge_id);
}

TEST_CASE("scheduler/plan: make_plan rejects placements that do not cover the graph") {
  graph g = parse_graph(four_ops, "four.pbtxt", 2);
  CHECK_THROWS_AS(make_plan(g, placed({0, 0, 0, 0})), std::invalid_argument);
  CHECK_THROWS_AS(make_plan(g, placed({0, 0, 0, 0, 0, 0})), std::invalid_argument);
  CHECK_THROWS_AS(make_plan(g, placed({})), std::invalid_argument);
  try {
    make_plan(g, placed({0, 0, -1, 0, 0}));
    FAIL("no error for a negative entry");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("'wte'") != std::string::npos);
  }
  CHECK_NOTHROW(make_plan(g, placed({0, 0, 0, 0, 0})));
}

TEST_CASE("scheduler/plan: format_plan lists the placement and every edge") {
  graph g = load_graph(src(tiny), 4);
  cluster_spec c = load_cluster(src("configs/clusters/local-3.pbtxt"));
  plan p = plan_run(g, c, profile_from_cluster(c), 41);
  std::string text = format_plan(g, c, p);
  INFO(text);
  CHECK(text.rfind(format_placement(g, c, p.where), 0) == 0);
  size_t edges_at = text.find("edges: " + std::to_string(p.edges.size()));
  REQUIRE(edges_at != std::string::npos);
  std::string section = text.substr(edges_at);
  for (auto& e : p.edges) {
    std::string line = "  " + std::to_string(e.id) + " ";
    size_t at = section.find("\n" + line);
    REQUIRE_MESSAGE(at != std::string::npos, "edge " << e.id);
    std::string row = section.substr(at + 1, section.find('\n', at + 1) - at - 1);
    CHECK(row.find(edge_kind_name(e.kind)) != std::string::npos);
    CHECK(row.find(g.nodes[e.producer].name + " -> " + g.nodes[e.consumer].name) != std::string::npos);
    CHECK(row.find(c.nodes[e.from].name + " -> " + c.nodes[e.to].name) != std::string::npos);
    CHECK(row.find(human_bytes(static_cast<double>(e.bytes_per_micro_batch))) != std::string::npos);
    CHECK(row.find("none") != std::string::npos);
  }
  CHECK(section.find("64.0 KiB") != std::string::npos);  // the residual stream at B=4
  // Placed on a node the cluster does not have: refused, not printed from out of range.
  plan bad = p;
  bad.where.node_of_op[0] = 3;
  CHECK_THROWS_AS(format_plan(g, c, bad), std::invalid_argument);
}

}  // namespace
}  // namespace fusion
