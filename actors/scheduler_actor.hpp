// The scheduler actor (docs/migration.md): it judges, on a thread of its own, whether the ops of
// a running job should move. Every scheduler.every steps the coordinator hands it a snapshot,
// a copy of the estimator refined by the steps measured so far and the running plan; the
// scheduler re-plans with OP-Fence from that estimator, weighs the proposal with its rebalancer
// (predicted gain against the migration's cost, confirmed over several evaluations) and answers
// a verdict. The coordinator logs every verdict, records it in the metrics and migrates at the
// next step boundary when the verdict says so. Planning (a DP over the OP-DAG) takes from
// milliseconds to a second: on its own thread it overlaps with the next step.
#pragma once

#include <caf/all.hpp>

#include <memory>

#include "scheduler/compression_plan.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/rebalancer.hpp"

namespace fusion {

/// What one evaluation judges.
struct schedule_snapshot {
  workload_estimator est;          ///< a copy: the coordinator's goes on learning meanwhile
  plan current;
  compression_config compression;
  rebalance_settings settings;
  int64_t step = 0;
  bool count = true;               ///< false: a look (the admin `plan`), the confirmations stay
  /// The first re-plan (scheduler.first): judged by rebalancer::judge_first over the
  /// `remaining` steps of the run, without confirmations.
  bool first = false;
  int64_t remaining = 0;
  /// Per cluster node: whether it may take work (joined, not draining). Empty: every node. The
  /// proposal is placed on those nodes only (scheduler/survivors.hpp), so that nodes that have
  /// not joined, left or were lost get nothing, and a node that joins is offered work.
  std::vector<bool> usable;
};

/// A verdict: the decision, the proposal it judged, or the reason there is none.
struct schedule_verdict {
  rebalance_decision decision;
  plan proposal;
  int64_t step = 0;
  bool first = false;              ///< the first re-plan's (schedule_snapshot::first)
  std::string error;               ///< planning failed: the run goes on as it is
};

using snapshot_ptr = std::shared_ptr<const schedule_snapshot>;
using verdict_ptr = std::shared_ptr<const schedule_verdict>;

}  // namespace fusion

// Within one process only: the coordinator and its scheduler share these by pointer.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(fusion::snapshot_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(fusion::verdict_ptr)

namespace fusion {

using evaluate_atom = caf::atom_constant<caf::atom("evaluate")>;
using forget_atom = caf::atom_constant<caf::atom("forget")>;

/// evaluate_atom(snapshot) -> verdict; forget_atom: restart the confirmations (after any
/// migration).
using scheduler_actor = caf::typed_actor<caf::replies_to<evaluate_atom, snapshot_ptr>::with<verdict_ptr>,
                                         caf::reacts_to<forget_atom>>;

/// Spawns the scheduler on a thread of its own.
scheduler_actor spawn_scheduler(caf::actor_system& sys);

}  // namespace fusion
