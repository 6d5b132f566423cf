// OP-Fence tests: the cut DP against brute force on random instances, its cost model on hand
// cases and its speed; fences on known topologies; chains that keep slow links off the
// pipeline; memory as a constraint and the error when nothing fits; work in proportion to node
// speed; cuts of a GPT where only the residual stream crosses; GPT-2 XL on 48 nodes. How long
// planning takes is measured by bench/opfence_bench.cpp, not asserted here: a timed unit test
// fails on a loaded machine.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"

namespace fusion {
namespace {

// K positions, n ops, every cost zero; tests fill in what they need.
cut_problem empty_problem(int k_count, int n, bool skip) {
  cut_problem p;
  p.compute_s.assign(k_count, std::vector<double>(n, 0.0));
  p.cross_bytes.assign(n, 0.0);
  p.seconds_per_byte.assign(k_count, std::vector<double>(k_count, 0.0));
  p.latency_s.assign(k_count, std::vector<double>(k_count, 0.0));
  p.memory_bytes.assign(n, 0.0);
  p.capacity_bytes.assign(k_count, 0.0);
  p.allow_skip = skip;
  return p;
}

// A random instance: 2 to 4 positions, 1 to 8 ops. Half the instances use small integer costs,
// so equal bottlenecks (and the total as tie-break) come up often; some links are infinitely
// fast; memory limits bind in about half.
cut_problem random_problem(std::mt19937& rng, bool skip) {
  std::uniform_int_distribution<int> k_dist(2, 4), n_dist(1, 8), small(0, 5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int k_count = k_dist(rng), n = n_dist(rng);
  bool integer = unit(rng) < 0.5;
  auto value = [&](double scale) { return integer ? static_cast<double>(small(rng)) : scale * unit(rng); };
  cut_problem p = empty_problem(k_count, n, skip);
  for (auto& row : p.compute_s)
    for (auto& v : row) v = value(5.0);
  for (int i = 1; i < n; ++i) p.cross_bytes[i] = value(1e6);
  for (int a = 0; a < k_count; ++a)
    for (int b = a + 1; b < k_count; ++b) {
      bool unshaped = unit(rng) < 0.2;
      p.seconds_per_byte[a][b] = unshaped ? 0.0 : (integer ? small(rng) * 1e-6 : unit(rng) * 5e-6);
      p.latency_s[a][b] = unshaped ? 0.0 : value(0.5);
    }
  double total_memory = 0;
  for (auto& m : p.memory_bytes) total_memory += (m = 1 + value(10.0));
  if (unit(rng) < 0.5)
    for (auto& cap : p.capacity_bytes) cap = unit(rng) < 0.2 ? 0.0 : total_memory * (0.3 + unit(rng) * 0.7);
  return p;
}

TEST_CASE("scheduler/opfence: the cut DP equals brute force on random instances") {
  std::mt19937 rng(20240611);
  int feasible = 0, infeasible = 0;
  for (int round = 0; round < 400; ++round) {
    bool skip = round % 2 == 1;
    cut_problem p = random_problem(rng, skip);
    INFO("round " << round << ": K=" << p.compute_s.size() << " n=" << p.memory_bytes.size() << " skip=" << skip);
    cut_solution dp = solve_cuts(p), brute = brute_force_cuts(p);
    REQUIRE(dp.feasible == brute.feasible);
    if (!dp.feasible) {
      ++infeasible;
      continue;
    }
    ++feasible;
    CHECK(dp.bottleneck == brute.bottleneck);
    CHECK(dp.total == doctest::Approx(brute.total).epsilon(1e-9));
    // The assignment the DP returns is valid and costs what it says.
    cut_solution again = evaluate_cuts(p, dp.position_of_op);
    REQUIRE(again.feasible);
    CHECK(again.bottleneck == dp.bottleneck);
    CHECK(again.total == dp.total);
    if (!skip && p.memory_bytes.size() >= p.compute_s.size()) {
      CHECK(dp.position_of_op.front() == 0);
      CHECK(dp.position_of_op.back() == static_cast<int>(p.compute_s.size()) - 1);
    }
  }
  // Both kinds occur, so both paths were compared.
  CHECK(feasible > 200);
  CHECK(infeasible > 5);
}

TEST_CASE("scheduler/opfence: cut costs on hand-computed cases") {
  // Two positions, four ops of 1 s each: the cut in the middle, unless the bytes there are dear.
  cut_problem p = empty_problem(2, 4, false);
  for (auto& row : p.compute_s) std::fill(row.begin(), row.end(), 1.0);
  p.cross_bytes = {0, 10, 1000, 10};
  p.seconds_per_byte[0][1] = 1e-3;  // 1000 bytes cost 1 s, 10 bytes 0.01 s
  p.latency_s[0][1] = 0.5;
  cut_solution s = solve_cuts(p);
  REQUIRE(s.feasible);
  // Cut before op 2: stages 2 s and 2 s, cut 1.5 s. Before op 1 or 3: stage 3 s, cut 0.51 s.
  CHECK(s.position_of_op == std::vector<int>{0, 0, 1, 1});
  CHECK(s.bottleneck == doctest::Approx(2.0));
  CHECK(s.total == doctest::Approx(5.5));
  p.cross_bytes[2] = 3000;  // now the middle cut costs 3.5 s: a 3-op stage is better
  s = solve_cuts(p);
  CHECK(s.bottleneck == doctest::Approx(3.0));
  CHECK(s.total == doctest::Approx(4.51));  // both ends tie on bottleneck and total
  CHECK((s.position_of_op == std::vector<int>{0, 1, 1, 1} || s.position_of_op == std::vector<int>{0, 0, 0, 1}));

  // Memory: position 0 holds at most 2 ops' worth, so the cut moves although compute is even.
  cut_problem m = empty_problem(2, 4, false);
  m.compute_s = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  m.memory_bytes = {5, 5, 1, 1};
  m.capacity_bytes = {6, 0};
  s = solve_cuts(m);
  REQUIRE(s.feasible);
  CHECK(s.position_of_op == std::vector<int>{0, 1, 1, 1});
  m.capacity_bytes = {4, 0};  // op 0 alone does not fit on position 0, and position 0 must take one
  CHECK_FALSE(solve_cuts(m).feasible);
  m.allow_skip = true;        // unless position 0 may stay empty
  s = solve_cuts(m);
  REQUIRE(s.feasible);
  CHECK(s.position_of_op == std::vector<int>{1, 1, 1, 1});

  // Skip: a position behind a dear link stays empty; without skip it must take an op.
  cut_problem k3 = empty_problem(3, 6, true);
  k3.compute_s = {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}};
  k3.latency_s = {{0, 100, 0.1}, {0, 0, 100}, {0, 0, 0}};
  s = solve_cuts(k3);
  CHECK(s.position_of_op == std::vector<int>{0, 0, 0, 2, 2, 2});
  CHECK(s.bottleneck == doctest::Approx(3.0));
  k3.allow_skip = false;
  CHECK(solve_cuts(k3).bottleneck == doctest::Approx(100.0));

  // Fewer ops than positions without skip: solved as with skip, spare positions stay empty.
  cut_problem few = empty_problem(4, 2, false);
  few.compute_s = {{5, 5}, {1, 1}, {2, 9}, {9, 1}};
  s = solve_cuts(few);
  REQUIRE(s.feasible);
  CHECK(s.bottleneck == doctest::Approx(1.0));
  CHECK(s.position_of_op == std::vector<int>{1, 3});

  // Degenerate sizes.
  CHECK(solve_cuts(empty_problem(3, 0, false)).feasible);
  CHECK_FALSE(solve_cuts(empty_problem(0, 3, true)).feasible);
  CHECK_FALSE(evaluate_cuts(k3, {0, 0, 1, 1, 0, 2}).feasible);  // not monotone
}

// A GPT-2 XL-sized problem (about 480 ops) and a 800-op one, on 48 positions without skip and
// 16 with: the DP finds a plan that fits memory (its speed: bench/opfence_bench.cpp).
TEST_CASE("scheduler/opfence: the cut DP solves big problems") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.5, 1.5);
  for (auto [k_bound, n_bound, skip_bound] : {std::tuple{48, 485, false}, std::tuple{48, 800, false}, std::tuple{16, 800, true}}) {
    // Plain copies: clang 14 (the fuzz and sanitizer builds) cannot capture structured bindings.
    const int k_count = k_bound, n = n_bound;
    const bool skip = skip_bound;
    cut_problem p = empty_problem(k_count, n, skip);
    for (int i = 0; i < n; ++i) {
      double base = unit(rng);
      for (int k = 0; k < k_count; ++k) p.compute_s[k][i] = base * (1 + k % 3);
      p.cross_bytes[i] = 1e6 * unit(rng);
      p.memory_bytes[i] = 1e8 * unit(rng);
    }
    for (int a = 0; a < k_count; ++a)
      for (int b = a + 1; b < k_count; ++b) {
        p.seconds_per_byte[a][b] = 8e-9 * (1 + (a / 16 != b / 16) * 100);
        p.latency_s[a][b] = 1e-3;
      }
    for (auto& cap : p.capacity_bytes) cap = 1e8 * n / k_count * 2;
    cut_solution s = solve_cuts(p);
    INFO("K=" << k_count << " n=" << n << " skip=" << skip);
    REQUIRE(s.feasible);
    CHECK(evaluate_cuts(p, s.position_of_op).bottleneck == s.bottleneck);
  }
}

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }


// "s3" (operator+ on a literal trips a GCC 12 -Wrestrict false positive).
std::string numbered(const char* prefix, int i) {
  std::string out = prefix;
  out += std::to_string(i);
  return out;
}

// One site per entry of `sites` ("name" or "name:count" nodes, named name0, name1, ...), then
// `rest` (links, a placement section). Nodes may carry `node_extra` (e.g. gflops).
cluster_spec cluster_text(const std::vector<std::string>& sites, const std::string& rest = "",
                          const std::string& node_extra = "") {
  std::string text = "name: \"t\"\n", nodes;
  for (auto& entry : sites) {
    std::string name = entry.substr(0, entry.find(':'));
    int count = entry.find(':') == std::string::npos ? 1 : std::stoi(entry.substr(entry.find(':') + 1));
    text += "site { name: \"" + name + "\" }\n";
    for (int i = 0; i < count; ++i)
      nodes += "node { name: \"" + name + std::to_string(i) + "\" site: \"" + name + "\"" + node_extra + " }\n";
  }
  return parse_cluster(text + nodes + rest, "c.pbtxt");
}

std::string link(const std::string& a, const std::string& b, double mbit) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "link { a: \"%s\" b: \"%s\" mbit: %g }\n", a.c_str(), b.c_str(), mbit);
  return buf;
}

// Every pair of `sites` at `mbit`, except pairs already in `given`.
std::string links_between(const std::vector<std::string>& sites, double mbit, const std::set<std::pair<std::string, std::string>>& given = {}) {
  std::string out;
  for (size_t i = 0; i < sites.size(); ++i)
    for (size_t j = i + 1; j < sites.size(); ++j)
      if (!given.count({sites[i], sites[j]}) && !given.count({sites[j], sites[i]})) out += link(sites[i], sites[j], mbit);
  return out;
}

cluster_profile profile_of(const cluster_spec& c, int micro_batches) {
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = micro_batches;
  return p;
}

std::vector<std::vector<int>> fences_of(const cluster_spec& c, double gap_factor = 4.0) {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 2);
  workload_estimator est(g, c, profile_of(c, 1));
  return make_fences(est, gap_factor);
}

using fence_list = std::vector<std::vector<int>>;

TEST_CASE("scheduler/opfence: fences on known topologies") {
  // Two fast pairs joined by slow links: two fences.
  CHECK(fences_of(cluster_text({"a", "b", "c", "d"}, link("a", "b", 1000) + link("c", "d", 1000) +
                                                         links_between({"a", "b", "c", "d"}, 10, {{"a", "b"}, {"c", "d"}}))) ==
        fence_list{{0, 1}, {2, 3}});
  // The same with the pairs as sites of two nodes each (inside a site: the local rate).
  CHECK(fences_of(cluster_text({"a:2", "b:2"}, link("a", "b", 8))) == fence_list{{0, 1}, {2, 3}});
  // Three fast groups: three fences; file order of the nodes does not matter.
  CHECK(fences_of(cluster_text({"a", "c", "e", "b", "d", "f"},
                               link("a", "b", 1000) + link("c", "d", 1000) + link("e", "f", 1000) +
                                   links_between({"a", "b", "c", "d", "e", "f"}, 10,
                                                 {{"a", "b"}, {"c", "d"}, {"e", "f"}}))) ==
        fence_list{{0, 3}, {1, 4}, {2, 5}});
  // Three tiers (LAN inside sites, 500 Mbit/s metro pairs, 5 Mbit/s WAN between them): cut at
  // the widest gap, 100x metro/WAN, not at the 20x LAN/metro one.
  std::vector<std::string> tiers{"s0:2", "s1:2", "s2:2", "s3:2"};
  std::string tier_links = link("s0", "s1", 500) + link("s2", "s3", 500) +
                           links_between({"s0", "s1", "s2", "s3"}, 5, {{"s0", "s1"}, {"s2", "s3"}});
  CHECK(fences_of(cluster_text(tiers, tier_links)) == fence_list{{0, 1, 2, 3}, {4, 5, 6, 7}});
  // No gap that wide: one fence. A gap just below the factor does not split either.
  CHECK(fences_of(cluster_text(tiers, tier_links), 200).size() == 1);
  CHECK(fences_of(cluster_text({"a", "b", "c"}, link("a", "b", 1000) + link("a", "c", 400) + link("b", "c", 400))).size() == 1);
  CHECK(fences_of(cluster_text({"a", "b", "c"}, link("a", "b", 1000) + link("a", "c", 200) + link("b", "c", 200))) ==
        fence_list{{0, 1}, {2}});
  // One site: one fence, whatever the factor.
  CHECK(fences_of(cluster_text({"a:3"})) == fence_list{{0, 1, 2}});
  CHECK(fences_of(cluster_text({"a:3"}), 1.0) == fence_list{{0, 1, 2}});
  // All links equal (stated, or none: unshaped): one fence.
  CHECK(fences_of(cluster_text({"a", "b", "c", "d"}, links_between({"a", "b", "c", "d"}, 100))) ==
        fence_list{{0, 1, 2, 3}});
  CHECK(fences_of(cluster_text({"a:2", "b", "c"})) == fence_list{{0, 1, 2, 3}});
  // Nodes of one site stay together even when the site's own rate is the slower one.
  CHECK(fences_of(cluster_text({"a:2", "b"}, link("a", "b", 1e6))) == fence_list{{0, 1, 2}});
}

// sites-3: a-b 1000 Mbit/s, b-c 100, a-c 8.
const std::string three_sites = link("a", "b", 1000) + link("b", "c", 100) + link("a", "c", 8);

TEST_CASE("scheduler/opfence: chains keep the slow link off and cross between fences once") {
  graph g = load_graph(src("configs/models/gpt-char-small.pbtxt"), 4);
  cluster_spec c = cluster_text({"a", "b", "c"}, three_sites);
  workload_estimator est(g, c, profile_of(c, 4));
  auto fences = make_fences(est, 4.0);
  CHECK(fences == fence_list{{0, 1}, {2}});
  auto chains = candidate_chains(est, fences, 24);
  REQUIRE(!chains.empty());
  for (auto& chain : chains) {
    INFO("chain " << chain[0] << chain[1] << chain[2]);
    REQUIRE(chain.size() == 3);
    CHECK(chain[1] == 1);  // b in the middle: a and c are never neighbours
  }
  opfence_report report;
  placement p = opfence_place(est, {}, &report);
  CHECK(report.fences == fences);
  CHECK(report.candidates >= 1);
  CHECK(report.chain[1] == 1);
  CHECK(report.estimate.step_s > 0);
  CHECK(report.bottleneck_s > 0);
  // No op of a1 talks to c1 directly.
  for (auto& n : g.nodes)
    for (auto& e : n.consumers) {
      int a = p.node_of_op[n.id], b = p.node_of_op[e.node];
      CHECK_FALSE(((a == 0 && b == 2) || (a == 2 && b == 0)));
    }

  // Two sites of three nodes joined by one slow link (and a third, slower, site pair): every
  // candidate crosses between the two fences exactly once, and the chain starts or ends in each.
  cluster_spec six = cluster_text({"x:3", "y:3"}, link("x", "y", 20));
  workload_estimator est6(g, six, profile_of(six, 4));
  auto fences6 = make_fences(est6, 4.0);
  REQUIRE(fences6 == fence_list{{0, 1, 2}, {3, 4, 5}});
  auto chains6 = candidate_chains(est6, fences6, 24);
  CHECK(chains6.size() >= 2);
  for (auto& chain : chains6) {
    REQUIRE(chain.size() == 6);
    CHECK(std::set<int>(chain.begin(), chain.end()).size() == 6);
    int crossings = 0;
    for (size_t i = 1; i < chain.size(); ++i) crossings += (chain[i - 1] < 3) != (chain[i] < 3);
    CHECK(crossings == 1);
  }
  CHECK(static_cast<int>(candidate_chains(est6, fences6, 1).size()) == 1);
}

// Memory of every compute op of `g` as OP-Fence sees it (inputs with their first consumer).
double model_memory(const workload_estimator& est) {
  cut_problem p = make_cut_problem(est, {0}, true);
  return std::accumulate(p.memory_bytes.begin(), p.memory_bytes.end(), 0.0);
}

std::string gib_attr(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " memory_gib: %.9g", bytes / double(uint64_t{1} << 30));
  return buf;
}

TEST_CASE("scheduler/opfence: memory is respected, a model that fits nowhere is refused clearly") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  cluster_spec open = cluster_text({"a", "b"});
  double need = model_memory(workload_estimator(g, open, profile_of(open, 2)));
  REQUIRE(need > 0);

  // Without limits the two nodes share the work; with 60% of the model each, it must be split
  // so that neither stage exceeds its node.
  cluster_spec split = cluster_text({"a", "b"}, "", gib_attr(0.6 * need));
  workload_estimator est(g, split, profile_of(split, 2));
  opfence_report report;
  placement p = opfence_place(est, {}, &report);
  auto memory = est.simulate(make_plan(g, p)).node_memory_bytes;
  REQUIRE(memory.size() == 2);
  for (int k = 0; k < 2; ++k) {
    CHECK(memory[k] > 0);
    CHECK(memory[k] <= double(est.profile().nodes[k].memory_bytes));
  }

  // One node that holds everything and one that holds little: the small one gets at most what
  // fits (here it may stay empty: chains this short may skip a node).
  cluster_spec lopsided = parse_cluster(
      "name: \"t\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
      "node { name: \"a0\" site: \"a\"" + gib_attr(1.2 * need) + " }\n"
      "node { name: \"b0\" site: \"b\"" + gib_attr(0.05 * need) + " }\n", "c.pbtxt");
  workload_estimator est2(g, lopsided, profile_of(lopsided, 2));
  auto memory2 = est2.simulate(make_plan(g, opfence_place(est2))).node_memory_bytes;
  CHECK(memory2[1] <= double(est2.profile().nodes[1].memory_bytes));

  // 30% and 35% of the model: no split fits. The message names the file, the model, the node
  // with the most memory, its GiB and what the smallest stage it could take needs.
  cluster_spec small = parse_cluster(
      "name: \"t\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
      "node { name: \"a0\" site: \"a\"" + gib_attr(0.3 * need) + " }\n"
      "node { name: \"b0\" site: \"b\"" + gib_attr(0.35 * need) + " }\n", "c.pbtxt");
  workload_estimator est3(g, small, profile_of(small, 2));
  std::string e;
  try {
    opfence_place(est3);
  } catch (const placement_error& err) {
    e = err.what();
  }
  INFO(e);
  CHECK(e.rfind("c.pbtxt: model 'gpt-char-tiny' does not fit in memory", 0) == 0);
  CHECK(e.find("node 'b0' has the most memory") != std::string::npos);
  CHECK(e.find("GiB") != std::string::npos);
  CHECK(e.find("the smallest stage it could take needs") != std::string::npos);
  CHECK(e.find("alone needs") != std::string::npos);
  // The placer says the same through place_ops (the cluster file's default policy).
  CHECK_THROWS_AS(place_ops(g, small, profile_of(small, 2)), placement_error);

  // A chain that must use every node (longer than skip_nodes_up_to) with a node too small for
  // any op: the chain's halves either side of its slowest link are candidates too, so a plan
  // without that node is found.
  cluster_spec tiny_node = parse_cluster(
      "name: \"t\"\nsite { name: \"a\" }\n"
      "node { name: \"a0\" site: \"a\" }\nnode { name: \"a1\" site: \"a\"" + gib_attr(1e-6 * need) + " }\n"
      "node { name: \"a2\" site: \"a\" }\n", "c.pbtxt");
  workload_estimator est4(g, tiny_node, profile_of(tiny_node, 2));
  opfence_options every_node;
  every_node.skip_nodes_up_to = 2;
  placement p_every = opfence_place(est4, every_node);
  for (int k : p_every.node_of_op) CHECK(k != 1);
  // Allowed to skip it, the other two take the model.
  placement p4 = opfence_place(est4);
  for (int k : p4.node_of_op) CHECK(k != 1);
}

// Op times proportional to FLOPs, `speed` times faster on the node of that index.
cluster_profile timed_profile(const graph& g, const cluster_spec& c, const std::vector<double>& speed) {
  cluster_profile p = profile_of(c, 4);
  std::vector<double> flops = op_flops(g);
  for (size_t k = 0; k < c.nodes.size(); ++k)
    for (int id : distinct_ops(g)) {
      double s = flops[id] / 2e10 / speed[k];
      p.nodes[k].ops[op_key(g, id)] = op_timing{s / 3, 2 * s / 3, 0};
    }
  return p;
}

TEST_CASE("scheduler/opfence: a node twice as fast gets about twice the work") {
  graph g = load_graph(src("configs/models/gpt-char-small.pbtxt"), 4);
  cluster_spec c = cluster_text({"a:2"});
  // The DP's cut balances stage compute; the simulator's refinement may then move a few ops
  // more onto the fast node (the slow stage's share of pipeline fill and drain), never making
  // the predicted step slower.
  opfence_options dp_only;
  dp_only.refine_shift = 0;
  for (auto speed : {std::vector<double>{1, 2}, std::vector<double>{2, 1}}) {
    workload_estimator est(g, c, timed_profile(g, c, speed));
    int fast = speed[0] > speed[1] ? 0 : 1;
    placement p = opfence_place(est, dp_only);
    double dp_share = describe_placement(g, c, p)[fast].share;
    INFO("fast node " << fast << " share " << dp_share);
    CHECK(dp_share == doctest::Approx(2.0 / 3).epsilon(0.05));
    opfence_report r;
    placement q = opfence_place(est, {}, &r);
    double refined_share = describe_placement(g, c, q)[fast].share;
    INFO("refined share " << refined_share << " after " << r.refined_moves << " moves");
    CHECK(r.estimate.step_s <= r.dp_step_s);
    CHECK(refined_share >= dp_share - 0.02);
    CHECK(refined_share < 0.85);
  }
  // Through the stated rates of the cluster file too (op::cost over gflops; memory-bound ops
  // do not speed up, so the share is looser).
  cluster_spec rated = parse_cluster(
      "name: \"t\"\nsite { name: \"a\" }\n"
      "node { name: \"slow\" site: \"a\" gflops: 50 }\nnode { name: \"fast\" site: \"a\" gflops: 100 }\n", "c.pbtxt");
  workload_estimator est(g, rated, profile_of(rated, 4));
  placement p = opfence_place(est, dp_only);
  double share = describe_placement(g, rated, p)[1].share;
  INFO("fast share " << share);
  CHECK(share > 0.6);
  CHECK(share < 0.72);
}

TEST_CASE("scheduler/opfence: cuts of a GPT fall where only the residual stream crosses") {
  const int64_t batch = 4;
  const int micro_batches = 4;
  graph g = load_graph(src("configs/models/gpt-char-small.pbtxt"), batch);
  // The residual stream: (B, T, C) floats. Inside a transformer stack every cut carries at
  // least two tensors of that size (between blocks, one tensor to ln1 and to the residual
  // add); after qkv, fc or gelu four or five times that. 100 Mbit/s makes bytes count.
  const double stream = double(batch) * double(g.context) * 256 * 4;
  for (int n : {2, 3}) {
    std::vector<std::string> sites;
    for (int i = 0; i < n; ++i) sites.push_back(numbered("s", i));
    cluster_spec c = cluster_text(sites, links_between(sites, 100));
    workload_estimator est(g, c, profile_of(c, micro_batches));
    // The cut problem counts a fan-out once per consumer: before h1.ln1, h0.res2 crosses twice.
    cut_problem problem = make_cut_problem(est, {0, 1}, false);
    std::vector<int> ops;
    for (auto& node : g.nodes)
      if (!node.is_input()) ops.push_back(node.id);
    auto at = [&](const char* name) {
      return static_cast<size_t>(std::find(ops.begin(), ops.end(), g.find(name)) - ops.begin());
    };
    CHECK(problem.cross_bytes[at("h1.ln1")] == doctest::Approx(2 * micro_batches * stream));
    CHECK(problem.cross_bytes[at("h1.attn")] == doctest::Approx(4 * micro_batches * stream));
    CHECK(problem.cross_bytes[at("h1.fc2")] == doctest::Approx(5 * micro_batches * stream));
    CHECK(problem.cross_bytes[at("wpe")] == doctest::Approx(micro_batches * stream));

    opfence_report report;
    placement p = opfence_place(est, {}, &report);
    plan pl = make_plan(g, p);
    int cuts = 0;
    for (size_t i = 1; i < ops.size(); ++i) {
      if (p.node_of_op[ops[i]] == p.node_of_op[ops[i - 1]]) continue;
      ++cuts;
      INFO(n << " nodes: cut before " << g.nodes[ops[i]].name);
      CHECK(problem.cross_bytes[i] <= 2 * micro_batches * stream * (1 + 1e-9));
    }
    CHECK(cuts == n - 1);  // every node works: the model is big enough for three
    for (auto& e : pl.edges) {
      if (!e.forward()) continue;
      INFO("edge " << g.nodes[e.producer].name << " -> " << g.nodes[e.consumer].name);
      CHECK(g.nodes[e.producer].shape == shape_t{batch, g.context, 256});  // residual width only
    }
  }
}

TEST_CASE("scheduler/opfence: GPT-2 XL on 48 nodes in three sites fences by site and keeps 10 Mbit/s off the chain") {
  graph g = load_graph(src("configs/models/gpt2-xl.pbtxt"), 1);
  std::string text = "name: \"paper-48\"\nsite { name: \"a\" }\nsite { name: \"b\" }\nsite { name: \"c\" }\n";
  for (int i = 0; i < 48; ++i) {
    const char* site = i < 16 ? "a" : i < 32 ? "b" : "c";
    const char* rates = i < 16 ? "device: \"cuda:0\" gflops: 19500 memory_gib: 40"
                                : i < 32 ? "device: \"cuda:0\" gflops: 8000 memory_gib: 24"
                                         : "device: \"cpu\" gflops: 1000 memory_gib: 64";
    text += "node { name: \"g" + std::to_string(i) + "\" site: \"" + site + "\" " + rates + " }\n";
  }
  // Fences by site: inside 10 Gbit/s, a-b 400 Mbit/s (a 25x gap), b-c 100, a-c 10.
  text += link("a", "b", 400) + link("b", "c", 100) + link("a", "c", 10);
  cluster_spec c = parse_cluster(text, "paper-48.pbtxt");
  workload_estimator est(g, c, profile_of(c, 8));
  opfence_report report;
  placement p = opfence_place(est, {}, &report);
  MESSAGE("gpt2-xl on 48 nodes: " << report.candidates << " candidates, " << report.fences.size()
                                  << " fences, predicted step " << report.estimate.step_s << " s");
  CHECK(report.fences == fence_list{
                             [] { std::vector<int> v(16); std::iota(v.begin(), v.end(), 0); return v; }(),
                             [] { std::vector<int> v(16); std::iota(v.begin(), v.end(), 16); return v; }(),
                             [] { std::vector<int> v(16); std::iota(v.begin(), v.end(), 32); return v; }()});
  // The chain goes a - b - c (or back), or a part of it: the 10 Mbit/s link is never on it.
  MESSAGE("chain of " << report.chain.size() << " nodes");
  REQUIRE(report.chain.size() >= 16);
  for (size_t i = 1; i < report.chain.size(); ++i) {
    int sa = report.chain[i - 1] / 16, sb = report.chain[i] / 16;
    CHECK(std::abs(sa - sb) <= 1);
  }
  auto step = est.simulate(make_plan(g, p));
  for (size_t k = 0; k < c.nodes.size(); ++k) {
    INFO("node " << c.nodes[k].name);
    CHECK(step.node_memory_bytes[k] <= double(est.profile().nodes[k].memory_bytes));
  }
}

TEST_CASE("scheduler/opfence: twelve fences of four sites follow the fast links") {
  // 48 single-node sites in 12 groups of 4: 1000 Mbit/s inside a group, 100 / distance between
  // groups, so the best chain visits the groups in order (more than 6 fences: greedy orders).
  graph g = load_graph(src("configs/models/gpt2-xl.pbtxt"), 1);
  std::vector<std::string> sites;
  for (int i = 0; i < 48; ++i) sites.push_back(numbered("s", i));
  std::string links;
  for (int i = 0; i < 48; ++i)
    for (int j = i + 1; j < 48; ++j)
      links += link(sites[i], sites[j], i / 4 == j / 4 ? 1000 : 100.0 / std::abs(i / 4 - j / 4));
  cluster_spec c = cluster_text(sites, links, " device: \"cuda:0\" gflops: 10000 memory_gib: 40");
  workload_estimator est(g, c, profile_of(c, 8));
  opfence_report report;
  opfence_place(est, {}, &report);
  MESSAGE("gpt2-xl on 12 fences of 4 nodes: " << report.candidates << " candidates");
  CHECK(report.fences.size() == 12);
  MESSAGE("chain of " << report.chain.size() << " nodes");
  REQUIRE(report.chain.size() >= 4);
  for (size_t i = 1; i < report.chain.size(); ++i) CHECK(std::abs(report.chain[i - 1] / 4 - report.chain[i] / 4) <= 1);
}

}  // namespace
}  // namespace fusion
