// OP-Fence: the cut problem of a chain and the choice among candidates by simulation. Fences and
// candidate chains are in opfence_chains.cpp, the cut DP in opfence_cut.cpp.
#include "scheduler/opfence.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "scheduler/schedule.hpp"

namespace fusion {

namespace {

constexpr double gib = double(uint64_t{1} << 30);

std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / gib);  // "40 GiB", "1.25 GiB", "0.00312 GiB"
  return buf;
}

// Per cluster node: seconds per step of every compute op (ops in compute_ops order).
std::vector<std::vector<double>> compute_table(const workload_estimator& est, const std::vector<int>& ops) {
  int nodes = static_cast<int>(est.cluster().nodes.size());
  std::vector<std::vector<double>> t(nodes, std::vector<double>(ops.size()));
  for (int k = 0; k < nodes; ++k)
    for (size_t i = 0; i < ops.size(); ++i) t[k][i] = est.step_compute_s(ops[i], k);
  return t;
}

// The chain-independent part of the cut problem: cross bytes and memory per op.
struct op_tables {
  std::vector<int> ops;
  std::vector<double> cross_bytes, memory_bytes;
};

op_tables make_op_tables(const workload_estimator& est) {
  const graph& g = est.model();
  op_tables t;
  t.ops = compute_ops(g);
  const size_t n = t.ops.size();
  std::vector<int> index(g.nodes.size(), -1);
  for (size_t i = 0; i < n; ++i) index[t.ops[i]] = static_cast<int>(i);
  // An edge u -> w (positions a < b) crosses every cut before ops a+1..b: a difference array.
  // One entry per consumer slot, so a tensor read twice beyond the cut counts twice. With the
  // loader's fan-out nodes that is only a cut just after one (the plan moves the node across it
  // and sends once), and the cut just before it, as fast to compute, is priced right.
  std::vector<double> diff(n + 1, 0.0);
  const double m = est.micro_batches();
  for (size_t a = 0; a < n; ++a) {
    double bytes = m * est.output_bytes(t.ops[a]);
    for (auto& e : g.nodes[t.ops[a]].consumers) {
      int b = index[e.node];
      if (b <= static_cast<int>(a)) continue;
      diff[a + 1] += bytes;
      diff[b + 1] -= bytes;
    }
  }
  t.cross_bytes.assign(n, 0.0);
  double run = 0;
  for (size_t i = 0; i < n; ++i) t.cross_bytes[i] = (run += diff[i]);
  if (n > 0) t.cross_bytes[0] = 0;
  t.memory_bytes.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) t.memory_bytes[i] = est.memory_bytes(t.ops[i]);
  // An input lives with its first consumer (place_inputs), so its memory is that op's.
  for (auto& node : g.nodes) {
    if (!node.is_input()) continue;
    int first = -1;
    for (auto& e : node.consumers)
      if (index[e.node] >= 0 && (first < 0 || index[e.node] < first)) first = index[e.node];
    if (first >= 0) t.memory_bytes[first] += est.memory_bytes(node.id);
  }
  return t;
}

cut_problem cut_problem_of(const workload_estimator& est, const std::vector<int>& chain, bool allow_skip,
                           const op_tables& ops, const std::vector<std::vector<double>>& compute) {
  const size_t k_count = chain.size();
  cut_problem p;
  p.allow_skip = allow_skip;
  p.cross_bytes = ops.cross_bytes;
  p.memory_bytes = ops.memory_bytes;
  p.compute_s.reserve(k_count);
  for (int node : chain) p.compute_s.push_back(compute[node]);
  p.seconds_per_byte.assign(k_count, std::vector<double>(k_count, 0.0));
  p.latency_s.assign(k_count, std::vector<double>(k_count, 0.0));
  p.capacity_bytes.assign(k_count, 0.0);
  // The DP prices one step. A link is busy bytes / rate per tensor (the bytes are already times
  // M), while the half round trip of one tensor overlaps the next tensor (the estimator's link
  // model), so latency is paid once per direction and step, not per micro-batch: the pipeline
  // waits rtt / 2 when its forward crosses and again when its backward crosses back, rtt in all.
  for (size_t a = 0; a < k_count; ++a) {
    for (size_t b = a + 1; b < k_count; ++b) {
      double mbit = est.link_mbit(chain[a], chain[b]);
      p.seconds_per_byte[a][b] = std::isinf(mbit) ? 0.0 : 8.0 / (mbit * 1e6);
      p.latency_s[a][b] = est.link_rtt_s(chain[a], chain[b]);
    }
    const auto& nodes = est.profile().nodes;
    p.capacity_bytes[a] = chain[a] < static_cast<int>(nodes.size()) ? static_cast<double>(nodes[chain[a]].memory_bytes) : 0.0;
  }
  return p;
}

}  // namespace

cut_problem compress_links(cut_problem p, double ratio) {
  if (!(ratio > 0 && ratio <= 1)) throw std::invalid_argument("opfence: a cut's bytes ratio must be in (0, 1]");
  for (auto& row : p.seconds_per_byte)
    for (double& s : row) s *= ratio;
  return p;
}

namespace {

// Why nothing fits: names the node and the memory, in the words of placement_error.
[[noreturn]] void throw_does_not_fit(const workload_estimator& est, const op_tables& ops, const opfence_options& options) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  const auto& nodes = est.profile().nodes;
  const size_t n = ops.ops.size(), k_count = c.nodes.size();
  double need = 0, have = 0;
  size_t biggest_op = 0, smallest_op = 0;
  for (size_t i = 0; i < n; ++i) {
    need += ops.memory_bytes[i];
    if (ops.memory_bytes[i] > ops.memory_bytes[biggest_op]) biggest_op = i;
    if (ops.memory_bytes[i] < ops.memory_bytes[smallest_op]) smallest_op = i;
  }
  int most = -1, least = -1;
  bool unlimited = false;
  for (size_t k = 0; k < k_count; ++k) {
    double cap = k < nodes.size() ? static_cast<double>(nodes[k].memory_bytes) : 0.0;
    if (cap <= 0) {
      unlimited = true;
      continue;
    }
    have += cap;
    if (most < 0 || cap > static_cast<double>(nodes[most].memory_bytes)) most = static_cast<int>(k);
    if (least < 0 || cap < static_cast<double>(nodes[least].memory_bytes)) least = static_cast<int>(k);
  }
  std::string head = c.file + ": model '" + g.name + "' does not fit in memory with M=" +
                     std::to_string(est.micro_batches()) + " micro-batches per step: ";
  auto op_name = [&](size_t i) { return g.nodes[ops.ops[i]].name; };
  if (unlimited && least >= 0) {
    // Only a chain that must use every node fails this way: a node too small for any op.
    throw placement_error(head + "node '" + c.nodes[least].name + "' has " + gib_text(double(nodes[least].memory_bytes)) +
                          ", the smallest stage it could take needs " + gib_text(ops.memory_bytes[smallest_op]) +
                          " (the op '" + op_name(smallest_op) + "' alone), and chains of more than " +
                          std::to_string(options.skip_nodes_up_to) + " nodes give every node at least one op");
  }
  if (most < 0) throw placement_error(head + "no chain of the cluster's nodes could take its ops");
  // The smallest stage the biggest node could take: the largest stage of the split into
  // contiguous stages that is most even by memory.
  double smallest_stage = ops.memory_bytes[biggest_op];
  size_t parts = std::min(n, k_count);
  if (parts > 0) {
    std::vector<size_t> cuts = balanced_cuts(ops.memory_bytes, parts);
    for (size_t s = 0; s + 1 < cuts.size(); ++s)
      smallest_stage = std::max(smallest_stage, std::accumulate(ops.memory_bytes.begin() + cuts[s],
                                                                ops.memory_bytes.begin() + cuts[s + 1], 0.0));
  }
  std::string text = "node '" + c.nodes[most].name + "' has the most memory, " +
                     gib_text(double(nodes[most].memory_bytes)) + ", and the smallest stage it could take needs " +
                     gib_text(smallest_stage) + " (the op '" + op_name(biggest_op) + "' alone needs " +
                     gib_text(ops.memory_bytes[biggest_op]) + ")";
  if (smallest_stage <= double(nodes[most].memory_bytes))
    text = "no split of its ops in graph order over the nodes fits each node's memory; node '" + c.nodes[most].name +
           "' has the most, " + gib_text(double(nodes[most].memory_bytes)) + " (the op '" + op_name(biggest_op) +
           "' alone needs " + gib_text(ops.memory_bytes[biggest_op]) + ")";
  throw placement_error(head + text + "; the ops need " + gib_text(need) + " in all, the " + std::to_string(k_count) +
                        " nodes have " + gib_text(have) + " together (fewer or smaller micro-batches need less)");
}

}  // namespace


cut_problem make_cut_problem(const workload_estimator& est, const std::vector<int>& chain, bool allow_skip) {
  op_tables ops = make_op_tables(est);
  return cut_problem_of(est, chain, allow_skip, ops, compute_table(est, ops.ops));
}

// Judged under eager alone, a plan that 1F1B makes fastest lost to one only eager favours
// (sites-3, batch 64 in 16 micro-batches: OP-Fence's plan 9.01 s under eager, even's 8.26 s
// under 1F1B).
step_estimate simulate_candidate(const workload_estimator& est, const opfence_options& options, const placement& p) {
  plan wired = make_plan(est.model(), p);
  if (options.prepare_plan) options.prepare_plan(wired);
  return simulate_schedule(est, wired, options.schedule);
}

step_estimate candidate_cache::simulate(const workload_estimator& est, const opfence_options& options, const placement& p) {
  key k{p.node_of_op, p.stage_of_op, {}, {}, p.routes};
  for (const stage_replicas& s : p.stages) {
    std::get<2>(k).push_back(s.nodes);
    std::get<3>(k).push_back(s.weights);
  }
  auto it = done_.find(k);
  if (it != done_.end()) {
    ++hits_;
    return it->second;
  }
  return done_.emplace(std::move(k), simulate_candidate(est, options, p)).first->second;
}

namespace {

// Hill-climbing on the chosen plan's cut positions with the simulator as the judge. The DP
// minimises the bottleneck stage or cut; the simulated step also pays for pipeline fill and
// drain and for the order ops run in, so moving a cut by an op or two can be faster. A move
// shifts one boundary between two consecutive stages by `d` ops, never emptying a stage, and
// must fit in memory (evaluate_cuts); the first improving move is kept, until none improves or
// the simulation budget is spent.
void refine_cuts(const workload_estimator& est, const opfence_options& options, const op_tables& ops,
                 const std::vector<std::vector<double>>& compute, placement& best, opfence_report& result,
                 candidate_cache& cache) {
  if (options.refine_shift <= 0 || result.chain.empty()) return;
  const graph& g = est.model();
  const std::vector<int>& chain = result.chain;
  std::vector<int> node_pos(est.cluster().nodes.size(), -1);
  for (size_t k = 0; k < chain.size(); ++k) node_pos[chain[k]] = static_cast<int>(k);
  std::vector<int> pos(ops.ops.size());
  for (size_t i = 0; i < ops.ops.size(); ++i) pos[i] = node_pos[best.node_of_op[ops.ops[i]]];
  const cut_problem problem = cut_problem_of(est, chain, true, ops, compute);
  const int n = static_cast<int>(pos.size());
  int budget = options.refine_simulations;
  bool improved = true;
  while (improved && budget > 0) {
    improved = false;
    for (int i = 1; i < n && !improved && budget > 0; ++i) {
      if (pos[i] == pos[i - 1]) continue;  // not a boundary
      int left_start = i - 1, right_end = i;
      while (left_start > 0 && pos[left_start - 1] == pos[i - 1]) --left_start;
      while (right_end + 1 < n && pos[right_end + 1] == pos[i]) ++right_end;
      for (int d = -options.refine_shift; d <= options.refine_shift && !improved && budget > 0; ++d) {
        const int b = i + d;  // the new first op of the right stage
        if (d == 0 || b <= left_start || b > right_end) continue;
        std::vector<int> moved = pos;
        for (int j = std::min(i, b); j < std::max(i, b); ++j) moved[j] = d < 0 ? pos[i] : pos[i - 1];
        if (!evaluate_cuts(problem, moved).feasible) continue;
        placement p;
        p.node_of_op.assign(g.nodes.size(), -1);
        for (int j = 0; j < n; ++j) p.node_of_op[ops.ops[j]] = chain[moved[j]];
        place_inputs(g, p, std::vector<bool>(g.nodes.size(), false));
        step_estimate step = cache.simulate(est, options, p);
        --budget;
        if (step.step_s < result.estimate.step_s * (1 - 1e-9)) {
          pos = std::move(moved);
          best = std::move(p);
          result.estimate = std::move(step);
          ++result.refined_moves;
          improved = true;
        }
      }
    }
  }
}

}  // namespace

placement opfence_pipeline_place(const workload_estimator& est, const opfence_options& options,
                                 opfence_report* report) {
  candidate_cache cache;
  return opfence_pipeline_place(est, options, report, cache);
}

placement opfence_pipeline_place(const workload_estimator& est, const opfence_options& options, opfence_report* report,
                                 candidate_cache& cache) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  if (c.nodes.empty()) throw placement_error(c.file + ": the cluster has no nodes");
  auto fences = make_fences(est, options.gap_factor);
  auto chains = candidate_chains(est, fences, options.max_candidates);
  // A site behind a very slow link may not pay for itself, and chains longer than
  // skip_nodes_up_to cannot leave nodes out: each chain is also tried as its two halves either
  // side of its slowest link.
  {
    std::set<std::vector<int>> seen(chains.begin(), chains.end());
    const size_t whole = chains.size();
    for (size_t c = 0; c < whole; ++c) {
      const std::vector<int> chain = chains[c];
      if (chain.size() < 2) continue;
      size_t slowest = 0;
      for (size_t j = 1; j + 1 < chain.size(); ++j)
        if (est.link_mbit(chain[j], chain[j + 1]) < est.link_mbit(chain[slowest], chain[slowest + 1])) slowest = j;
      for (auto half : {std::vector<int>(chain.begin(), chain.begin() + slowest + 1),
                        std::vector<int>(chain.begin() + slowest + 1, chain.end())})
        if (seen.insert(half).second) chains.push_back(std::move(half));
    }
  }
  op_tables ops = make_op_tables(est);
  auto compute = compute_table(est, ops.ops);

  opfence_report result;
  result.fences = fences;
  struct candidate {
    placement where;
    std::vector<int> chain;
    double bottleneck = 0;
    step_estimate step;
    bool compressed = false;  // from the compression-aware DP
  };
  std::vector<candidate> all;
  // Per chain up to three cuts: the DP's (with empty nodes allowed on short chains), the DP's
  // using every node, and equal FLOPs along the chain. The DP's bottleneck is a proxy for the
  // step time (it does not see pipeline fill and drain); the simulation decides.
  const std::vector<double> flops = op_flops(g);
  std::vector<double> op_cost(ops.ops.size());
  for (size_t i = 0; i < ops.ops.size(); ++i) op_cost[i] = flops[ops.ops[i]];
  auto consider = [&](const std::vector<int>& chain, const std::vector<int>& position_of_op, double bottleneck,
                      bool compressed = false) {
    placement p;
    p.node_of_op.assign(g.nodes.size(), -1);
    for (size_t i = 0; i < ops.ops.size(); ++i) p.node_of_op[ops.ops[i]] = chain[position_of_op[i]];
    place_inputs(g, p, std::vector<bool>(g.nodes.size(), false));
    step_estimate step = cache.simulate(est, options, p);
    all.push_back({std::move(p), chain, bottleneck, std::move(step), compressed});
  };
  // Equal FLOPs along `chain` (the even policy's rule), when it fits in memory.
  auto consider_even = [&](const std::vector<int>& chain, const cut_problem& problem) {
    std::vector<size_t> bounds = balanced_cuts(op_cost, chain.size());
    std::vector<int> position(ops.ops.size());
    for (size_t k = 0; k + 1 < bounds.size(); ++k)
      for (size_t i = bounds[k]; i < bounds[k + 1]; ++i) position[i] = static_cast<int>(k);
    cut_solution even = evaluate_cuts(problem, position);
    if (even.feasible) consider(chain, position, even.bottleneck);
  };
  for (auto& chain : chains) {
    const bool skip = static_cast<int>(chain.size()) <= options.skip_nodes_up_to;
    const cut_problem problem = cut_problem_of(est, chain, skip, ops, compute);
    cut_solution cut = solve_cuts(problem);
    if (cut.feasible) consider(chain, cut.position_of_op, cut.bottleneck);
    if (skip) {
      cut_problem every = problem;
      every.allow_skip = false;
      cut_solution used = solve_cuts(every);
      if (used.feasible && used.position_of_op != cut.position_of_op) consider(chain, used.position_of_op, used.bottleneck);
    }
    // The compression-aware DP: the same problem with the links as cheap as the codec makes
    // them; its cuts stand beside the dense ones and the simulator (with the codecs that
    // prepare_plan assigns) judges both.
    if (options.cut_bytes_ratio < 1) {
      cut_problem compressed = compress_links(problem, options.cut_bytes_ratio);
      for (int pass = 0; pass < (skip ? 2 : 1); ++pass) {  // as the dense DP: with skips, then without
        compressed.allow_skip = skip && pass == 0;
        const cut_solution c = solve_cuts(compressed);
        if (c.feasible && c.position_of_op != cut.position_of_op)
          consider(chain, c.position_of_op, evaluate_cuts(problem, c.position_of_op).bottleneck, true);
      }
    }
    if (chain.size() <= ops.ops.size()) consider_even(chain, problem);
  }
  // The even policy's placement (equal FLOPs along the cluster file's node order) stands among
  // the candidates: the chains above follow the links and may all differ from the file's order,
  // and their DP cuts balance sustained paces, which misjudge nodes with idle gaps under a CPU
  // quota (on sites-3 every candidate was predicted 15% slower than even, and ran so). With it
  // OP-Fence is never predicted slower than even. (A chain in the file's order had it already.)
  std::vector<int> file_order(c.nodes.size());
  std::iota(file_order.begin(), file_order.end(), 0);
  if (file_order.size() <= ops.ops.size() && std::find(chains.begin(), chains.end(), file_order) == chains.end())
    consider_even(file_order, cut_problem_of(est, file_order, false, ops, compute));
  if (all.empty()) throw_does_not_fit(est, ops, options);
  std::stable_sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.step.step_s < b.step.step_s; });
  result.candidates = static_cast<int>(all.size());
  result.dp_step_s = all.front().step.step_s;
  // Hill-climbing depends on where it starts: refine the best few and keep the fastest. The
  // compressed DP's candidates come on top of the best few of the others, never in their place,
  // so the search with them is never predicted slower than without (same budget per start).
  constexpr size_t starts = 3;
  std::vector<size_t> refine;
  for (bool dense_only : {false, true})
    for (size_t i = 0, taken = 0; i < all.size() && taken < starts; ++i) {
      if (dense_only && all[i].compressed) continue;
      ++taken;
      if (std::find(refine.begin(), refine.end(), i) == refine.end()) refine.push_back(i);
    }
  opfence_options each = options;
  each.refine_simulations = options.refine_simulations / static_cast<int>(std::min(all.size(), starts));
  placement best;
  bool found = false;
  for (size_t i : refine) {
    opfence_report r = result;
    r.chain = all[i].chain;
    r.bottleneck_s = all[i].bottleneck;
    r.estimate = all[i].step;
    placement p = all[i].where;
    refine_cuts(est, each, ops, compute, p, r, cache);
    if (!found || r.estimate.step_s < result.estimate.step_s) {
      found = true;
      best = std::move(p);
      result = std::move(r);
    }
  }
  if (report) *report = std::move(result);
  return best;
}

placement opfence_placer::place(const graph& g, const cluster_spec& c, const cluster_profile& profile) const {
  workload_estimator est(g, c, profile);
  return opfence_place(est, options_);
}

}  // namespace fusion
