// OP-Fence's fences and candidate chains: fences by single linkage on the links' rates, and the
// node orders (chains) a pipeline is cut along, built from them. Plain logic over the estimator's
// link rates, no CAF or CUDA.
#include "scheduler/opfence.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace fusion {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// Union-find over node indices.
struct groups {
  std::vector<int> parent;
  explicit groups(int n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int a) { return parent[a] == a ? a : parent[a] = find(parent[a]); }
  bool join(int a, int b) {
    a = find(a);
    b = find(b);
    if (a == b) return false;
    parent[std::max(a, b)] = std::min(a, b);
    return true;
  }
};

// How good a path is as a piece of a chain: its slowest link (higher is better), then the sum of
// 1/rate over its links (lower is better: the other links matter too, but less).
struct path_score {
  double slowest = inf;
  double inverse_sum = 0;
  bool better_than(const path_score& o) const {
    if (slowest != o.slowest) return slowest > o.slowest;
    return inverse_sum < o.inverse_sum;
  }
};

template <class Rate>
path_score score_path(const std::vector<int>& path, const Rate& rate) {
  path_score s;
  for (size_t i = 1; i < path.size(); ++i) {
    double r = rate(path[i - 1], path[i]);
    s.slowest = std::min(s.slowest, r);
    s.inverse_sum += std::isinf(r) ? 0.0 : 1.0 / r;
  }
  return s;
}

// Paths through every item, from `entry` (if >= 0) to `exit` (if >= 0), best first by
// path_score, ties by `key` (lower first: faster nodes first). Up to 6 items every order is tried;
// beyond, a greedy path from each possible start (next: the fastest link from the last item;
// ties: lower key, then lower index), which keeps the work O(items^3).
template <class Rate>
std::vector<std::vector<int>> best_paths(std::vector<int> items, const Rate& rate, const std::vector<double>& key,
                                         int entry, int exit) {
  auto key_less = [&](int a, int b) { return key[a] != key[b] ? key[a] < key[b] : a < b; };
  std::sort(items.begin(), items.end(), key_less);
  std::vector<std::vector<int>> paths;
  auto valid = [&](const std::vector<int>& p) {
    if (p.size() > 1 && entry >= 0 && p.front() != entry) return false;
    if (p.size() > 1 && exit >= 0 && p.back() != exit) return false;
    return true;
  };
  if (items.size() <= 6) {
    std::vector<int> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    do {
      std::vector<int> p;
      for (int i : order) p.push_back(items[i]);
      if (valid(p)) paths.push_back(p);
    } while (std::next_permutation(order.begin(), order.end()));
  } else {
    for (int start : items) {
      if (entry >= 0 && start != entry) continue;
      if (exit >= 0 && start == exit) continue;
      std::vector<int> p{start};
      std::vector<bool> used(key.size(), false);
      used[start] = true;
      if (exit >= 0) used[exit] = true;
      for (size_t step = p.size() + (exit >= 0 ? 1 : 0); step < items.size(); ++step) {
        int next = -1;
        for (int c : items) {
          if (used[c]) continue;
          if (next < 0 || rate(p.back(), c) > rate(p.back(), next)) next = c;  // items are in key order
        }
        used[next] = true;
        p.push_back(next);
      }
      if (exit >= 0) p.push_back(exit);
      paths.push_back(p);
    }
  }
  // Stable: among equal scores the earlier path (faster items first) stays first.
  std::vector<path_score> scores;
  for (auto& p : paths) scores.push_back(score_path(p, rate));
  std::vector<size_t> index(paths.size());
  std::iota(index.begin(), index.end(), 0);
  std::stable_sort(index.begin(), index.end(), [&](size_t a, size_t b) { return scores[a].better_than(scores[b]); });
  std::vector<std::vector<int>> out;
  for (size_t i : index) out.push_back(paths[i]);
  return out;
}

}  // namespace

// Fences by single linkage on log-bandwidth. Kruskal's algorithm joins node groups from the
// fastest link down, after first joining the nodes of each site (whatever their measured rate:
// a site is one network); the joins are the maximum spanning tree, their rates the levels of
// the dendrogram. We cut it once, at the widest ratio between consecutive levels, if that ratio
// is at least gap_factor; ties go to the slower gap (the slowest links are the ones to keep off
// the pipeline). Cuts inside the site joins are not allowed. An infinite rate counts as the
// fastest finite rate (or the estimator's local rate) when ratios are taken.
std::vector<std::vector<int>> make_fences(const workload_estimator& est, double gap_factor) {
  const int nodes = static_cast<int>(est.cluster().nodes.size());
  struct link {
    bool same_site;
    double mbit;
    int a, b;
  };
  std::vector<link> links;
  for (int a = 0; a < nodes; ++a)
    for (int b = a + 1; b < nodes; ++b)
      links.push_back({est.cluster().nodes[a].site_index == est.cluster().nodes[b].site_index, est.link_mbit(a, b), a, b});
  std::sort(links.begin(), links.end(), [](const link& x, const link& y) {
    return std::tie(y.same_site, y.mbit, x.a, x.b) < std::tie(x.same_site, x.mbit, y.a, y.b);
  });
  groups tree(nodes);
  std::vector<link> joins;
  size_t site_joins = 0;
  for (auto& l : links)
    if (tree.join(l.a, l.b)) {
      joins.push_back(l);
      site_joins += l.same_site ? 1 : 0;
    }
  double top = est.options().local_mbit;
  for (auto& j : joins)
    if (!std::isinf(j.mbit)) top = std::max(top, j.mbit);
  auto level = [&](size_t m) { return std::log(std::isinf(joins[m].mbit) ? top : joins[m].mbit); };
  // Splitting before join m keeps joins [0, m).
  // Ratios equal up to rounding (1000/100 and 100/10) count as a tie.
  size_t split = joins.size();
  double widest = -inf;
  for (size_t m = std::max<size_t>(site_joins, 1); m < joins.size(); ++m) {
    double gap = level(m - 1) - level(m);
    if (gap >= std::log(gap_factor) - 1e-9 && gap >= widest - 1e-9) {
      widest = std::max(widest, gap);
      split = m;
    }
  }
  groups fence(nodes);
  for (size_t m = 0; m < split; ++m) fence.join(joins[m].a, joins[m].b);
  std::vector<std::vector<int>> out;
  std::vector<int> slot(nodes, -1);
  for (int a = 0; a < nodes; ++a) {  // roots are the smallest members, so fences come out sorted
    int r = fence.find(a);
    if (slot[r] < 0) {
      slot[r] = static_cast<int>(out.size());
      out.emplace_back();
    }
    out[slot[r]].push_back(a);
  }
  return out;
}

// Chains: fence orders best first (best_paths over fences, the rate between two fences being
// their fastest node pair); for each, the crossing between consecutive fences uses that fastest
// pair (the exit node of one fence, the entry node of the next), and the nodes of a fence form
// the best path from its entry to its exit (faster nodes first where links tie, as within a
// site). Every chain is followed by its reverse; duplicates are dropped.
std::vector<std::vector<int>> candidate_chains(const workload_estimator& est, const std::vector<std::vector<int>>& fences,
                                               int max_candidates) {
  const int nodes = static_cast<int>(est.cluster().nodes.size());
  auto node_rate = [&](int a, int b) { return est.link_mbit(a, b); };
  std::vector<double> node_key(nodes, 0.0);  // compute seconds of the whole model: lower is faster
  std::vector<int> ops = compute_ops(est.model());
  for (int k = 0; k < nodes; ++k)
    for (int id : ops) node_key[k] += est.step_compute_s(id, k);

  const int f_count = static_cast<int>(fences.size());
  std::vector<std::vector<double>> fence_rate(f_count, std::vector<double>(f_count, inf));
  for (int f = 0; f < f_count; ++f)
    for (int h = 0; h < f_count; ++h) {
      if (f == h) continue;
      double best = 0;
      for (int a : fences[f])
        for (int b : fences[h]) best = std::max(best, node_rate(a, b));
      fence_rate[f][h] = best;
    }
  std::vector<double> fence_key(f_count, 0.0);
  for (int f = 0; f < f_count; ++f)
    for (int a : fences[f]) fence_key[f] += node_key[a] / static_cast<double>(fences[f].size());
  std::vector<int> all_fences(f_count);
  std::iota(all_fences.begin(), all_fences.end(), 0);
  auto orders = best_paths(all_fences, [&](int f, int h) { return fence_rate[f][h]; }, fence_key, -1, -1);

  std::vector<std::vector<int>> chains;
  std::set<std::vector<int>> seen;
  // The path inside a fence depends only on (fence, entry, exit): computed once each.
  std::map<std::tuple<int, int, int>, std::vector<int>> inner;
  for (auto& order : orders) {
    std::vector<int> chain;
    int entry = -1;
    for (size_t pos = 0; pos < order.size(); ++pos) {
      const auto& members = fences[order[pos]];
      int exit = -1, next_entry = -1;
      if (pos + 1 < order.size()) {
        double best = -1;
        for (int a : members) {
          if (members.size() > 1 && a == entry) continue;  // a fence of several nodes enters and leaves by different nodes
          for (int b : fences[order[pos + 1]]) {
            double r = node_rate(a, b);
            if (r > best || (r == best && node_key[a] + node_key[b] < node_key[exit] + node_key[next_entry])) {
              best = r;
              exit = a;
              next_entry = b;
            }
          }
        }
      }
      auto [it, fresh] = inner.try_emplace({order[pos], entry, exit});
      if (fresh) it->second = best_paths(members, node_rate, node_key, entry, exit).front();
      chain.insert(chain.end(), it->second.begin(), it->second.end());
      entry = next_entry;
    }
    for (int twice = 0; twice < 2; ++twice) {
      if (seen.insert(chain).second) chains.push_back(chain);
      std::reverse(chain.begin(), chain.end());
    }
    if (static_cast<int>(chains.size()) >= max_candidates) break;
  }
  // Orders come best first, and a chain's reverse scores the same, so the list is already sorted.
  if (static_cast<int>(chains.size()) > max_candidates) chains.resize(std::max(max_candidates, 0));
  return chains;
}

std::vector<int> compute_ops(const graph& g) {
  std::vector<int> ops;
  for (auto& n : g.nodes)
    if (!n.is_input()) ops.push_back(n.id);
  return ops;
}

}  // namespace fusion
