// OP-Fence with stage replicas: after the pipeline-only plan, chains of node groups, each group
// holding one stage with a replica per node (docs/scheduler.md, "Stage replicas"). Per candidate
// chain and group width the cut DP runs over the groups (a group's compute at the sum of its
// nodes' rates, its all-reduce beside it), the cut is wired with routes dealt by speed and
// simulated; the fastest plan wins and the pipeline-only plan keeps ties.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "scheduler/opfence.hpp"

namespace fusion {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// Seconds per micro-batch (forward + backward) of op `id` on node k, at its sustained pace.
double per_micro_batch_s(const workload_estimator& est, int id, int k) {
  return (est.forward_s(id, k) + est.backward_s(id, k)) * est.quota_stretch(k);
}

// The relative speed of node k on `ops`: 1 / its seconds per micro-batch (1 when free).
double speed_on(const workload_estimator& est, const std::vector<int>& ops, int k) {
  double s = 0;
  for (int id : ops) s += per_micro_batch_s(est, id, k);
  return s > 0 ? 1 / s : 1.0;
}

}  // namespace

std::vector<std::vector<int>> replica_groups(const std::vector<int>& chain, const std::vector<std::vector<int>>& fences,
                                             int width, bool span_fences) {
  std::vector<int> fence_of;
  for (size_t f = 0; f < fences.size(); ++f)
    for (int k : fences[f]) {
      if (k >= static_cast<int>(fence_of.size())) fence_of.resize(k + 1, -1);
      fence_of[k] = static_cast<int>(f);
    }
  auto fence = [&](int k) { return k < static_cast<int>(fence_of.size()) ? fence_of[k] : -1; };
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < chain.size(); ++i) {
    const bool boundary = i > 0 && !span_fences && fence(chain[i]) != fence(chain[i - 1]);
    if (out.empty() || boundary || static_cast<int>(out.back().size()) >= std::max(width, 1)) out.emplace_back();
    out.back().push_back(chain[i]);
  }
  return out;
}

cut_problem make_group_cut_problem(const workload_estimator& est, const std::vector<std::vector<int>>& groups,
                                   bool allow_skip, double ring_bytes_ratio, int64_t ring_every) {
  const std::vector<int> ops = compute_ops(est.model());
  const size_t n = ops.size(), kc = groups.size();
  // Cross bytes and memory do not depend on the chain.
  cut_problem p = make_cut_problem(est, {0}, allow_skip);
  p.allow_skip = allow_skip;
  const double m = est.micro_batches();
  p.compute_s.assign(kc, std::vector<double>(n, 0.0));
  p.reduce_s.assign(kc, std::vector<double>(n, 0.0));
  p.memory_at.assign(kc, p.memory_bytes);
  p.capacity_bytes.assign(kc, 0.0);
  p.seconds_per_byte.assign(kc, std::vector<double>(kc, 0.0));
  p.latency_s.assign(kc, std::vector<double>(kc, 0.0));
  auto spb = [&](int a, int b) {
    const double mbit = est.link_mbit(a, b);
    return std::isinf(mbit) ? 0.0 : 8.0 / (mbit * 1e6);
  };
  for (size_t g = 0; g < kc; ++g) {
    const auto& nodes = groups[g];
    const double r = static_cast<double>(nodes.size());
    // The ring: nodes[i] -> nodes[i + 1], its slowest link and longest round trip, and the
    // slowest member's ring work per byte (copies and sums, workload_estimator::ring_s_per_byte).
    double ring_spb = 0, ring_rtt = 0, ring_host = 0;
    for (size_t i = 0; nodes.size() > 1 && i < nodes.size(); ++i) {
      const int a = nodes[i], b = nodes[(i + 1) % nodes.size()];
      ring_spb = std::max(ring_spb, spb(a, b));
      ring_rtt = std::max(ring_rtt, est.link_rtt_s(a, b));
      ring_host = std::max(ring_host, est.ring_s_per_byte(a));
    }
    // A replica saves the activations of its share of the micro-batches: the memory of an op
    // at M micro-batches less the activations of the ones routed elsewhere (inputs that live
    // with an op keep their whole size).
    const double taken = std::ceil(m / r);
    for (size_t i = 0; i < n && nodes.size() > 1; ++i)
      p.memory_at[g][i] -= (m - taken) * est.activation_bytes(ops[i]);
    for (size_t i = 0; i < n; ++i) {
      double rate = 0, update = 0;
      for (int k : nodes) {
        const double t = per_micro_batch_s(est, ops[i], k);
        rate += t > 0 ? 1 / t : inf;
        update = std::max(update, est.update_s(ops[i], k) * est.quota_stretch(k));
      }
      p.compute_s[g][i] = (std::isinf(rate) || rate <= 0 ? 0.0 : m / rate) + update;
      if (nodes.size() > 1) {
        const double grad_bytes = est.param_bytes(ops[i]);
        if (grad_bytes > 0)
          p.reduce_s[g][i] = grad_bytes * ring_bytes_ratio * 2 * (r - 1) / r * ring_spb + 2 * (r - 1) * ring_rtt / 2 +
                             ring_host * workload_estimator::ring_work_bytes(grad_bytes, static_cast<int>(nodes.size()));
        // local:H runs the ring once every H steps: its bytes, rounds and host work per step are 1/H.
        p.reduce_s[g][i] /= static_cast<double>(std::max<int64_t>(1, ring_every));
      }
    }
    double cap = 0;
    for (int k : nodes) {
      const double have = static_cast<double>(est.profile().nodes[k].memory_bytes);
      if (have > 0) cap = cap > 0 ? std::min(cap, have) : have;
    }
    p.capacity_bytes[g] = cap;
  }
  for (size_t a = 0; a < kc; ++a)
    for (size_t b = a + 1; b < kc; ++b) {
      double worst = 0, rtt = 0;
      for (int x : groups[a])
        for (int y : groups[b]) {
          worst = std::max(worst, spb(x, y));
          rtt = std::max(rtt, est.link_rtt_s(x, y));
        }
      // Routes spread the micro-batches over min(R, R') node pairs that send in parallel.
      const double lanes = static_cast<double>(std::min(groups[a].size(), groups[b].size()));
      p.seconds_per_byte[a][b] = worst / lanes;
      p.latency_s[a][b] = rtt;
    }
  return p;
}

namespace {

// The placement of a group cut: replica 0 of every stage is its group's first node; the routes
// are dealt by each node's speed on the stage's ops.
placement group_placement(const workload_estimator& est, const std::vector<std::vector<int>>& groups,
                          const std::vector<int>& ops, const std::vector<int>& position_of_op) {
  const graph& g = est.model();
  placement p;
  p.node_of_op.assign(g.nodes.size(), -1);
  std::vector<std::vector<int>> stage_ops(groups.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    p.node_of_op[ops[i]] = groups[position_of_op[i]][0];
    stage_ops[position_of_op[i]].push_back(ops[i]);
  }
  place_inputs(g, p, std::vector<bool>(g.nodes.size(), false));
  std::vector<stage_replicas> stages;
  for (size_t k = 0; k < groups.size(); ++k) {
    if (stage_ops[k].empty() || groups[k].size() < 2) continue;
    stage_replicas s;
    s.nodes = groups[k];
    for (int node : groups[k]) s.weights.push_back(speed_on(est, stage_ops[k], node));
    // A replica the routes would give no micro-batch (more replicas than micro-batches, or one
    // much slower than the rest) only pays for memory and the all-reduce: it stays idle.
    for (bool dropped = true; dropped && s.nodes.size() > 1;) {
      dropped = false;
      const auto counts = deal_routes({s}, est.micro_batches());
      std::vector<int> taken(s.nodes.size(), 0);
      for (auto& row : counts) ++taken[row[0]];
      for (size_t r = s.nodes.size(); r-- > 1;)
        if (taken[r] == 0) {
          s.nodes.erase(s.nodes.begin() + static_cast<long>(r));
          s.weights.erase(s.weights.begin() + static_cast<long>(r));
          dropped = true;
        }
    }
    if (s.nodes.size() > 1) stages.push_back(std::move(s));
  }
  return replicate(std::move(p), std::move(stages), est.micro_batches());
}

}  // namespace

placement opfence_place(const workload_estimator& est, const opfence_options& options, opfence_report* report) {
  opfence_report result;
  candidate_cache cache;
  placement best = opfence_pipeline_place(est, options, &result, cache);
  if (!options.replicas || est.cluster().nodes.size() < 2) {
    if (report) *report = std::move(result);
    return best;
  }
  result.pipeline_step_s = result.estimate.step_s;
  const std::vector<int> ops = compute_ops(est.model());
  auto chains = candidate_chains(est, result.fences, std::max(options.replica_chains, 0));
  std::set<std::vector<std::vector<int>>> seen;
  for (auto& chain : chains)
    for (bool span : {false, true})
      for (int width : options.replica_widths) {
        // More replicas than micro-batches cannot all work.
        if (width < 2 || width > static_cast<int>(chain.size()) || width > est.micro_batches()) continue;
        auto groups = replica_groups(chain, result.fences, width, span);
        if (groups.size() == chain.size() || !seen.insert(groups).second) continue;
        cut_problem problem =
            make_group_cut_problem(est, groups, true, options.allreduce_bytes_ratio, options.allreduce_every);
        std::vector<std::vector<int>> cuts;
        cut_solution skip = solve_cuts(problem);
        if (skip.feasible) cuts.push_back(skip.position_of_op);
        problem.allow_skip = false;
        cut_solution every = solve_cuts(problem);
        if (every.feasible && (!skip.feasible || every.position_of_op != skip.position_of_op))
          cuts.push_back(every.position_of_op);
        // The compression-aware DP (opfence_options::cut_bytes_ratio), as in the pipeline's search.
        if (options.cut_bytes_ratio < 1) {
          cut_problem compressed = compress_links(problem, options.cut_bytes_ratio);
          for (bool allow : {true, false}) {
            compressed.allow_skip = allow;
            cut_solution c = solve_cuts(compressed);
            if (c.feasible && std::find(cuts.begin(), cuts.end(), c.position_of_op) == cuts.end())
              cuts.push_back(c.position_of_op);
          }
        }
        for (auto& position : cuts) {
          placement p = group_placement(est, groups, ops, position);
          step_estimate step = cache.simulate(est, options, p);
          ++result.replica_candidates;
          if (step.step_s < result.estimate.step_s * (1 - 1e-9)) {
            best = std::move(p);
            result.estimate = std::move(step);
            result.replicated = best.replicated();
            result.groups = groups;
            result.chain.clear();
            for (auto& grp : groups) result.chain.push_back(grp[0]);
            result.bottleneck_s =
                evaluate_cuts(make_group_cut_problem(est, groups, true, options.allreduce_bytes_ratio,
                                                     options.allreduce_every),
                              position)
                    .bottleneck;
          }
        }
      }
  if (report) *report = std::move(result);
  return best;
}

}  // namespace fusion
