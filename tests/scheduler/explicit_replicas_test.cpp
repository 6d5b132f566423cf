// Stage replicas stated in the cluster file: `replica` entries of an explicit assign make its ops
// one stage held by several nodes; replica sets that cannot work are refused at the file and line
// of the entry (a node twice in one stage, a node in two stages, an unknown node, a replica that
// does not fit in memory, an op left without a node).
#include <doctest/doctest.h>

#include <string>
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

// Four nodes n0..n3 on one site (lines 1-6), then `tail` from line 7.
const int tail_line = 7;
std::string cluster_text(const std::string& tail, const std::string& n2_extra = "") {
  return "name: \"c4\"\nsite { name: \"s\" }\nnode { name: \"n0\" site: \"s\" }\nnode { name: \"n1\" site: \"s\" }\n"
         "node { name: \"n2\" site: \"s\"" + n2_extra + " }\nnode { name: \"n3\" site: \"s\" }\n" + tail;
}

std::string error_of(const std::string& text) {
  try {
    cluster_spec c = parse_cluster(text, "c.pbtxt");
    graph g = load_graph(src(tiny), 2);
    place_ops(g, c);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

bool starts(const std::string& s, int line) { return s.rfind("c.pbtxt:" + std::to_string(line) + ": ", 0) == 0; }

TEST_CASE("scheduler/explicit-replicas: replica entries make a replicated stage") {
  graph g = load_graph(src(tiny), 2);
  cluster_spec c = parse_cluster(cluster_text("placement { policy: \"explicit\"\n"
                                              "  assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" ops: \"h0.*\" }\n"
                                              "  assign { node: \"n1\" replica: \"n2\" replica: \"n3\"\n"
                                              "    ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" }\n}\n"),
                                 "c.pbtxt");
  REQUIRE(c.placement.assigns.size() == 2);
  CHECK(c.placement.assigns[1].replicas == std::vector<std::string>{"n2", "n3"});
  CHECK(c.placement.assigns[1].replica_indices == std::vector<int>{2, 3});
  CHECK(c.placement.assigns[1].replica_lines == std::vector<int>{tail_line + 2, tail_line + 2});
  cluster_profile prof = profile_from_cluster(c);
  prof.micro_batches = 6;
  placement p = place_ops(g, c, prof);
  REQUIRE(p.replicated());
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[0].nodes == std::vector<int>{0});
  CHECK(p.stages[1].nodes == std::vector<int>{1, 2, 3});
  const int loss = g.find("loss");
  CHECK(p.replicas(loss) == 3);
  CHECK(p.node_of(loss, 2) == 3);
  CHECK(p.replicas(g.find("wte")) == 1);
  // Equal nodes: two micro-batches each.
  CHECK(routed_micro_batches(p, 1) == std::vector<int>{2, 2, 2});
  // The residual stream of h0 reaches every replica of the second stage once: its two readers
  // (h1.ln1 and the residual add h1.res1) read it through h0.res2.fan, which joins their stage.
  plan wired = make_plan(g, p);
  int to_replicas = 0;
  for (auto& e : wired.edges)
    if (e.forward() && e.producer == g.find("h0.res2")) ++to_replicas;
  CHECK(g.nodes[g.find("h0.res2.fan")].consumers.size() == 2);
  CHECK(wired.where.stage_of(g.find("h0.res2.fan")) == 1);
  CHECK(to_replicas == 3);
  std::string table = format_placement(g, c, p);
  CHECK(table.find("replica 3 of 3") != std::string::npos);
}

TEST_CASE("scheduler/explicit-replicas: replica sets that cannot work are refused with file and line") {
  const std::string head = "placement { policy: \"explicit\"\n  assign { node: \"n0\" ops: \"*\"\n";
  SUBCASE("the assign's own node as its replica") {
    std::string e = error_of(cluster_text(head + "    replica: \"n0\" }\n}\n"));
    INFO(e);
    CHECK(starts(e, tail_line + 2));
    CHECK(e.find("node 'n0' twice in one stage") != std::string::npos);
  }
  SUBCASE("a replica named twice") {
    std::string e = error_of(cluster_text(head + "    replica: \"n1\"\n    replica: \"n1\" }\n}\n"));
    INFO(e);
    CHECK(starts(e, tail_line + 3));
    CHECK(e.find("replica 'n1' twice in one stage (first at line " + std::to_string(tail_line + 2) + ")") !=
          std::string::npos);
  }
  SUBCASE("an unknown replica") {
    std::string e = error_of(cluster_text(head + "    replica: \"n9\" }\n}\n"));
    INFO(e);
    CHECK(starts(e, tail_line + 2));
    CHECK(e.find("unknown replica node 'n9'") != std::string::npos);
  }
  SUBCASE("a node in two stages") {
    std::string e = error_of(cluster_text("placement { policy: \"explicit\"\n"
                                          "  assign { node: \"n0\" replica: \"n1\" ops: \"wte\" ops: \"wpe\" }\n"
                                          "  assign { node: \"n2\" replica: \"n1\" ops: \"h*\" }\n}\n"));
    INFO(e);
    CHECK(starts(e, tail_line + 2));
    CHECK(e.find("replica 'n1' is already a replica of node 'n0' (line " + std::to_string(tail_line + 1) + ")") !=
          std::string::npos);
    std::string e2 = error_of(cluster_text("placement { policy: \"explicit\"\n"
                                           "  assign { node: \"n0\" replica: \"n1\" ops: \"wte\" }\n"
                                           "  assign { node: \"n1\" ops: \"h*\" }\n}\n"));
    INFO(e2);
    CHECK(starts(e2, tail_line + 2));
    CHECK(e2.find("node 'n1' is already a replica of node 'n0'") != std::string::npos);
  }
  SUBCASE("replica entries without explicit placement") {
    std::string e = error_of(cluster_text("placement { policy: \"even\"\n  assign { node: \"n0\" replica: \"n1\" ops: \"*\" }\n}\n"));
    CHECK(starts(e, tail_line + 1));
  }
  SUBCASE("an op left without a node") {
    std::string e = error_of(cluster_text("placement { policy: \"explicit\"\n"
                                          "  assign { node: \"n0\" replica: \"n1\" ops: \"h*\" }\n}\n"));
    INFO(e);
    CHECK(starts(e, tail_line));
    CHECK(e.find("unassigned") != std::string::npos);
  }
  SUBCASE("a replica that does not fit in memory") {
    // n2 states 1 MiB: the replica of every op cannot hold their parameters.
    std::string e = error_of(cluster_text(head + "    replica: \"n1\"\n    replica: \"n2\" }\n}\n",
                                          " memory_gib: 0.001"));
    INFO(e);
    CHECK(starts(e, tail_line + 3));
    CHECK(e.find("the stage of node 'n0' does not fit in memory: replica 3 of 3") != std::string::npos);
    CHECK(e.find("node 'n2' has") != std::string::npos);
  }
}

}  // namespace
}  // namespace fusion
