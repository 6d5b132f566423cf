// OP-Fence's cut step: the exact dynamic program over cut points of one chain, the brute force
// the tests check it against, and the cost of one assignment. Plain numbers in, no graph.
//
// Costs of an assignment (position_of_op non-decreasing; a stage is a maximal run of ops on one
// chain position): a stage on position k with ops [j, i) costs sum compute_s[k][j..i-1]; the cut
// in front of it, from the previous used position kp, costs cross_bytes[j] *
// seconds_per_byte[kp][k] + latency_s[kp][k]. bottleneck = max of all stage and cut costs;
// total = their sum. All three functions compute every cost with the same helpers (prefix sums)
// and add them up in the same order, so the DP's bottleneck equals the brute force's bit for bit.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>

#include "scheduler/opfence.hpp"

namespace fusion {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// The problem with prefix sums: compute and memory of any contiguous run in O(1).
struct cut_tables {
  const cut_problem& p;
  int n = 0, k_count = 0;
  bool skip = true;
  std::vector<std::vector<double>> compute_prefix;  // [k][i]: sum compute_s[k][0..i-1]
  std::vector<double> memory_prefix;                // [i]: sum memory_bytes[0..i-1]
  std::vector<std::vector<double>> reduce_prefix;   // [k][i]: sum reduce_s[k][0..i-1] (empty: none)
  std::vector<std::vector<double>> memory_at_prefix;  // [k][i]: sum memory_at[k][0..i-1] (empty: none)

  explicit cut_tables(const cut_problem& problem) : p(problem) {
    k_count = static_cast<int>(p.compute_s.size());
    n = k_count > 0 ? static_cast<int>(p.compute_s[0].size()) : static_cast<int>(p.memory_bytes.size());
    for (auto& row : p.compute_s)
      if (static_cast<int>(row.size()) != n) throw std::invalid_argument("cut_problem: compute_s rows differ in length");
    auto need = [&](size_t have, size_t want, const char* what) {
      if (have < want) throw std::invalid_argument(std::string("cut_problem: ") + what + " is too short");
    };
    need(p.cross_bytes.size(), static_cast<size_t>(n), "cross_bytes");
    need(p.memory_bytes.size(), static_cast<size_t>(n), "memory_bytes");
    need(p.capacity_bytes.size(), static_cast<size_t>(k_count), "capacity_bytes");
    need(p.seconds_per_byte.size(), static_cast<size_t>(k_count), "seconds_per_byte");
    need(p.latency_s.size(), static_cast<size_t>(k_count), "latency_s");
    for (int k = 0; k < k_count; ++k) {
      need(p.seconds_per_byte[k].size(), static_cast<size_t>(k_count), "a seconds_per_byte row");
      need(p.latency_s[k].size(), static_cast<size_t>(k_count), "a latency_s row");
    }
    // Without skip every position needs an op, which n < K ops cannot give: such a problem is
    // solved as if skipping were allowed (the spare positions stay empty) rather than refused.
    skip = p.allow_skip || n < k_count;
    compute_prefix.assign(k_count, std::vector<double>(n + 1, 0.0));
    for (int k = 0; k < k_count; ++k)
      for (int i = 0; i < n; ++i) compute_prefix[k][i + 1] = compute_prefix[k][i] + p.compute_s[k][i];
    memory_prefix.assign(n + 1, 0.0);
    for (int i = 0; i < n; ++i) memory_prefix[i + 1] = memory_prefix[i] + p.memory_bytes[i];
    if (!p.memory_at.empty()) {
      need(p.memory_at.size(), static_cast<size_t>(k_count), "memory_at");
      memory_at_prefix.assign(k_count, std::vector<double>(n + 1, 0.0));
      for (int k = 0; k < k_count; ++k) {
        need(p.memory_at[k].size(), static_cast<size_t>(n), "a memory_at row");
        for (int i = 0; i < n; ++i) memory_at_prefix[k][i + 1] = memory_at_prefix[k][i] + p.memory_at[k][i];
      }
    }
    if (!p.reduce_s.empty()) {
      need(p.reduce_s.size(), static_cast<size_t>(k_count), "reduce_s");
      reduce_prefix.assign(k_count, std::vector<double>(n + 1, 0.0));
      for (int k = 0; k < k_count; ++k) {
        need(p.reduce_s[k].size(), static_cast<size_t>(n), "a reduce_s row");
        for (int i = 0; i < n; ++i) reduce_prefix[k][i + 1] = reduce_prefix[k][i] + p.reduce_s[k][i];
      }
    }
  }

  // Grows as the stage extends either way (the DP's early exits rely on it).
  double stage(int k, int j, int i) const {
    const double compute = compute_prefix[k][i] - compute_prefix[k][j];
    if (reduce_prefix.empty()) return compute;
    return std::max(compute, reduce_prefix[k][i] - reduce_prefix[k][j]);
  }
  bool fits(int k, int j, int i) const {
    double cap = p.capacity_bytes[k];
    if (cap <= 0) return true;
    if (!memory_at_prefix.empty()) return memory_at_prefix[k][i] - memory_at_prefix[k][j] <= cap;
    return memory_prefix[i] - memory_prefix[j] <= cap;
  }
  double cut(int j, int kp, int k) const { return p.cross_bytes[j] * p.seconds_per_byte[kp][k] + p.latency_s[kp][k]; }
};

cut_solution infeasible() { return cut_solution{}; }

}  // namespace

cut_solution evaluate_cuts(const cut_problem& p, const std::vector<int>& position_of_op) {
  cut_tables t(p);
  if (static_cast<int>(position_of_op.size()) != t.n) return infeasible();
  if (t.n == 0) return cut_solution{true, {}, 0, 0};
  for (int i = 0; i < t.n; ++i) {
    int k = position_of_op[i];
    if (k < 0 || k >= t.k_count) return infeasible();
    if (i > 0 && k < position_of_op[i - 1]) return infeasible();
    if (!t.skip && i > 0 && k > position_of_op[i - 1] + 1) return infeasible();
  }
  if (!t.skip && (position_of_op.front() != 0 || position_of_op.back() != t.k_count - 1)) return infeasible();
  cut_solution s{true, position_of_op, 0, 0};
  // Stages left to right; the total adds the cut, then the stage, as the DP does.
  for (int j = 0, kp = -1; j < t.n;) {
    int k = position_of_op[j];
    int i = j;
    while (i < t.n && position_of_op[i] == k) ++i;
    if (!t.fits(k, j, i)) return infeasible();
    if (kp >= 0) {
      double c = t.cut(j, kp, k);
      s.bottleneck = std::max(s.bottleneck, c);
      s.total += c;
    }
    double st = t.stage(k, j, i);
    s.bottleneck = std::max(s.bottleneck, st);
    s.total += st;
    kp = k;
    j = i;
  }
  return s;
}

cut_solution brute_force_cuts(const cut_problem& p) {
  cut_tables t(p);
  cut_solution best;
  std::vector<int> pos(t.n, 0);
  // Every non-decreasing sequence of positions; evaluate_cuts rejects the ones the rules forbid.
  std::function<void(int, int)> rec = [&](int i, int lo) {
    if (i == t.n) {
      cut_solution s = evaluate_cuts(p, pos);
      if (s.feasible && (!best.feasible || s.bottleneck < best.bottleneck ||
                         (s.bottleneck == best.bottleneck && s.total < best.total)))
        best = s;
      return;
    }
    for (int k = lo; k < t.k_count; ++k) {
      pos[i] = k;
      rec(i + 1, k);
    }
  };
  if (t.n == 0 || t.k_count > 0) rec(0, 0);
  return best;
}

// Two passes, because lexicographic (bottleneck, total) does not decompose: a prefix with a worse
// bottleneck but less total work can win once a later stage dominates the bottleneck anyway.
//   1. min bottleneck B*: best[i][k] = least bottleneck of ops [0, i) with the last stage on
//      position k. max() is monotone, so this is an exact DP.
//   2. min total subject to every stage and cut costing at most B*: a plain sum, exact too; its
//      optimum has bottleneck exactly B* (B* is itself one of the compared costs).
// enter[j][k] folds the choice of the previous position: the best value of a state ending at op j
// on some kp < k, with the cut kp -> k in front of op j included. With it every (i, k) scans only
// the start j of its last stage: O(K n^2 + K^2 n) with skip, O(K n^2) without, and the scan over j
// stops once the stage alone (which only grows as it extends left) exceeds the best so far or
// the node's memory.
cut_solution solve_cuts(const cut_problem& p) {
  cut_tables t(p);
  const int n = t.n, kc = t.k_count;
  if (n == 0) return cut_solution{true, {}, 0, 0};
  if (kc == 0) return infeasible();

  // Pass 1: least bottleneck.
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(kc, inf));
  std::vector<std::vector<double>> enter(n + 1, std::vector<double>(kc, inf));
  for (int k = 0; k < kc; ++k) enter[0][k] = (t.skip || k == 0) ? 0.0 : inf;
  auto fill_enter = [&](int j, auto&& value_of, auto& out, std::vector<std::vector<int>>* from) {
    for (int k = 1; k < kc; ++k) {
      double e = inf;
      int arg = -1;
      for (int kp = t.skip ? 0 : k - 1; kp < k; ++kp) {
        double v = value_of(j, kp, k);
        if (v < e) {
          e = v;
          arg = kp;
        }
      }
      out[j][k] = e;
      if (from) (*from)[j][k] = arg;
    }
  };
  for (int i = 1; i <= n; ++i) {
    for (int k = 0; k < kc; ++k) {
      double b = inf;
      int j_min = t.skip ? 0 : k;
      for (int j = i - 1; j >= j_min; --j) {
        double st = t.stage(k, j, i);
        if (st > b || !t.fits(k, j, i)) break;
        double v = std::max(enter[j][k], st);
        if (v < b) b = v;
      }
      best[i][k] = b;
    }
    if (i < n)
      fill_enter(i, [&](int j, int kp, int k) { return std::max(best[j][kp], t.cut(j, kp, k)); }, enter, nullptr);
  }
  double bottleneck = inf;
  if (t.skip)
    for (int k = 0; k < kc; ++k) bottleneck = std::min(bottleneck, best[n][k]);
  else
    bottleneck = best[n][kc - 1];
  if (bottleneck == inf) return infeasible();

  // Pass 2: least total with every cost <= bottleneck. total[i][k] as best[i][k]; from_j and
  // from_kp remember the argmins for the reconstruction.
  std::vector<std::vector<double>> total(n + 1, std::vector<double>(kc, inf));
  std::vector<std::vector<double>> enter2(n + 1, std::vector<double>(kc, inf));
  std::vector<std::vector<int>> from_j(n + 1, std::vector<int>(kc, -1));
  std::vector<std::vector<int>> from_kp(n + 1, std::vector<int>(kc, -1));
  for (int k = 0; k < kc; ++k) enter2[0][k] = enter[0][k];
  for (int i = 1; i <= n; ++i) {
    for (int k = 0; k < kc; ++k) {
      double best_total = inf;
      int arg = -1;
      int j_min = t.skip ? 0 : k;
      for (int j = i - 1; j >= j_min; --j) {
        double st = t.stage(k, j, i);
        if (st > bottleneck || !t.fits(k, j, i)) break;
        double v = enter2[j][k] + st;
        if (v < best_total) {
          best_total = v;
          arg = j;
        }
      }
      total[i][k] = best_total;
      from_j[i][k] = arg;
    }
    if (i < n)
      fill_enter(
          i,
          [&](int j, int kp, int k) {
            double c = t.cut(j, kp, k);
            return c > bottleneck ? inf : total[j][kp] + c;
          },
          enter2, &from_kp);
  }
  int k_end = kc - 1;
  if (t.skip)
    for (int k = 0; k < kc; ++k)
      if (total[n][k] < total[n][k_end]) k_end = k;
  if (total[n][k_end] == inf) return infeasible();  // cannot happen: pass 1's optimum qualifies

  std::vector<int> position(n, -1);
  for (int i = n, k = k_end; i > 0;) {
    int j = from_j[i][k];
    for (int o = j; o < i; ++o) position[o] = k;
    if (j > 0) k = from_kp[j][k];
    i = j;
  }
  return evaluate_cuts(p, position);
}

}  // namespace fusion
