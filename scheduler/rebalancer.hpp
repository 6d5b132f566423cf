// The live scheduler's decision (docs/migration.md): every scheduler.every steps the run is
// re-planned from the estimator refined by what the steps measured, and the proposal is compared
// with the running plan. A migration pays only when the predicted step time gained, less the
// migration's cost (state bytes over the measured links) amortised over scheduler.horizon steps,
// exceeds scheduler.min-gain of the step time, and only once the same proposal has come back
// scheduler.confirmations evaluations in a row: measurements are noisy, and a scheduler that
// follows every blip moves ops back and forth (Petals issue #389). The one exception is the first
// re-plan (scheduler.first), once measured steps have corrected the join-time profile: it moves
// when the gain repays the move within the run's remaining steps. Pure logic: no CAF.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

/// The scheduler.* settings of a cluster run.
struct rebalance_settings {
  bool enabled = true;      ///< scheduler.enabled (OP-Fence runs only: other policies are the user's placement)
  int64_t every = 10;       ///< scheduler.every: evaluate every N steps
  double min_gain = 0.10;   ///< scheduler.min-gain: relative step-time gain required after the cost
  int64_t horizon = 200;    ///< scheduler.horizon: steps a migration's cost is spread over
  int64_t confirmations = 3;///< scheduler.confirmations: evaluations in a row proposing the same placement
  /// scheduler.first: the step of the one early re-plan (0: none; else at least 3, when the
  /// estimator has learnt from a measured step). The join-time profile times each op alone on an
  /// idle machine and can mislead the first plan; this re-plan moves without confirmations when
  /// the gain repays the move within the run's remaining steps.
  int64_t first = 4;
  /// Ok when every value is in range, else fails with a message naming the key, e.g.
  /// "scheduler.every must be at least 1, got 0".
  status check() const;
  /// Sets one key ("every", "min-gain", "horizon", "confirmations", "first", "enabled"; a
  /// "scheduler." prefix is accepted) from text, or fails saying why not and leaves *this unchanged.
  status set(const std::string& key, const std::string& value);
};

/// Predicted seconds to move the state of every op `to` places elsewhere than `from`: per
/// arriving replica (arriving_replicas: a moved op, or a replica on a node that held none of its
/// op) est.transfer_s(state bytes, node of replica 0 under `from`, its node); transfers between
/// one node pair queue on their link, different pairs overlap, so the slowest pair decides.
double migration_cost_s(const workload_estimator& est, const placement& from, const placement& to);

/// The outcome of one evaluation.
struct rebalance_decision {
  enum class verdict : uint8_t { keep, wait, migrate };
  verdict what = verdict::keep;
  placement target;                ///< the proposal
  std::vector<int> moved_ops;      ///< graph node ids whose nodes (any replica) the proposal changes
  double before_s = 0, after_s = 0;///< predicted step time of the running plan and of the proposal
  double cost_s = 0;               ///< migration_cost_s
  double gain = 0;                 ///< (before_s - after_s - cost_s / horizon) / before_s
  int64_t confirmed = 0;           ///< evaluations in a row that proposed this target (wait, migrate)
  std::string reason;              ///< one line in plain words
};

/// "keep", "wait" or "migrate".
const char* to_string(rebalance_decision::verdict v);

/// The scheduler's memory between evaluations: the proposal being confirmed.
class rebalancer {
 public:
  explicit rebalancer(rebalance_settings s = {});

  /// Judges a move from `current` (plans of est.model()). The decision being confirmed is a
  /// move to one target: the first proposal that gains more than min-gain becomes the
  /// candidate, and each later evaluation confirms it while the candidate, judged again with
  /// the latest measurements, still gains that much, whatever the re-planning proposes this
  /// time (OP-Fence may break near-ties differently from one evaluation to the next). When the
  /// candidate stops paying, `proposal` is judged instead and the count restarts. Verdicts:
  /// keep (nothing pays; the count restarts), wait (confirmed fewer than `confirmations`
  /// times), migrate (confirmed; the count restarts). Throws what simulate throws.
  rebalance_decision evaluate(const workload_estimator& est, const plan& current, const plan& proposal);

  /// The same judgement without touching the confirmations (what `plan` shows).
  rebalance_decision judge(const workload_estimator& est, const plan& current, const plan& proposal) const;

  /// One target judged alone: `confirmed` is the count it reaches if it pays.
  rebalance_decision assess(const workload_estimator& est, const plan& current, const plan& target,
                            int64_t confirmed) const;

  /// The first re-plan (scheduler.first): `proposal` judged with the migration's cost spread over
  /// the `remaining_steps` of the run instead of the horizon, and moved to at once when it gains
  /// more than min-gain (verdict migrate, confirmed 1), else keep. Touches no confirmation.
  rebalance_decision judge_first(const workload_estimator& est, const plan& current, const plan& proposal,
                                 int64_t remaining_steps) const;

  /// Forgets the proposal being confirmed (after any migration, or a manual move).
  void reset();
  const rebalance_settings& settings() const { return settings_; }
  /// New settings; the confirmations restart.
  void configure(rebalance_settings s);

 private:
  rebalance_settings settings_;
  std::optional<plan> candidate_;  // the target being confirmed
  int64_t confirmed_ = 0;
};

}  // namespace fusion
