// The CPU budget of a node under a CFS quota, as the step simulation (estimator_simulate.cpp)
// runs its tasks through it. Plain C++, tested directly (tests/scheduler/estimator_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu_quota.hpp"

namespace fusion {

/// A CPU node under a CFS quota of q cores (q < 1) with period P: the kernel lets its threads run
/// at full speed until they have used q P of CPU time in the current period, then pauses them
/// until the next period starts. Ops are timed at full speed (their CPU time), so a node with
/// idle gaps runs them that fast and a busy one is held to q of the wall time. Times are seconds
/// from the start of the step; a period starts `phase` seconds before the step does
/// (0 <= phase < P), with its budget whole: the real phase is unknown, so the simulation averages
/// over several (estimator_options::quota_phases).
class quota_budget {
 public:
  /// `binding`: the node's quota holds it back (workload_estimator::quota_stretch > 1); else no
  /// budget, the node runs every task at once.
  quota_budget(const cpu_quota& q, bool binding, double phase)
      : allowance_(binding && q.period_s > 0 ? q.cores * q.period_s : 0), period_(q.period_s), phase_(phase) {}

  /// Whether the quota holds the node back.
  bool binding() const { return allowance_ > 0; }

  /// When the node can next run at `t`, its work so far accounted: at t, or where the period
  /// holding t has no budget left, at the next period's start. A tensor a node sends leaves
  /// then: serializing and writing it take the node's threads, which the quota pauses with the
  /// rest (on sites-2x3 a paused sender stretched a 512 KB tensor's hop inside a site, an
  /// unshaped link, to 62 ms).
  double runnable_at(double t) const {
    if (allowance_ <= 0) return t;
    const auto at = static_cast<int64_t>(std::floor((t + phase_) / period_));
    return at == index_ && used_ >= allowance_ * (1 - 1e-12) ? static_cast<double>(index_ + 1) * period_ - phase_ : t;
  }

  /// The end of `work` seconds of full-speed CPU started at `start`, the node's earlier work
  /// having used its share of the budget.
  double run(double start, double work) {
    if (allowance_ <= 0 || !(work > 0)) return start + std::max(work, 0.0);
    return run_shifted(start + phase_, work) - phase_;
  }

 private:
  // run() in the periods' time (0 where a period starts).
  double run_shifted(double start, double work) {
    const auto at = static_cast<int64_t>(std::floor(start / period_));
    if (at > index_) index_ = at, used_ = 0;
    // What the current period has left (until its budget or its end).
    const double slice = std::max(0.0, std::min({allowance_ - used_, static_cast<double>(index_ + 1) * period_ - start}));
    // Rounding may leave a few ulps of work: that is done.
    if (work <= slice * (1 + 1e-12)) {
      used_ += work;
      return start + work;
    }
    // The rest from the start of the next period: whole periods' budgets, then a part of one.
    double left = work - slice;
    const double full = std::floor(left / allowance_ * (1 + 1e-12));
    index_ += 1 + static_cast<int64_t>(full);
    left = std::max(0.0, left - full * allowance_);
    if (left <= allowance_ * 1e-12 && full > 0) {
      // Ends exactly as the last whole period's budget runs out.
      --index_;
      used_ = allowance_;
      return static_cast<double>(index_) * period_ + allowance_;
    }
    used_ = left;
    return static_cast<double>(index_) * period_ + left;
  }

  double allowance_;       // CPU seconds per period; 0: no binding quota
  double period_;
  double phase_;           // where in its period the node is when the step starts
  int64_t index_ = -1;     // the period the node last ran in
  double used_ = 0;        // CPU seconds used in it
};

}  // namespace fusion
