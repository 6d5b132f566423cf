// Re-planning a run on the nodes that survive a node loss (docs/recovery.md): the same policy as
// at start on a cluster without the lost nodes, the placement given back in the indices of the
// whole cluster file so that the running coordinator keeps its node numbering. Plain C++.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

/// A placement on the surviving nodes, and how it was reached.
struct survivor_placement {
  placement where;   ///< indices into the whole cluster's nodes; only surviving nodes appear
  /// What differs from planning at start, in plain words ("" when nothing): an explicit plan
  /// that named a lost node for ops with no surviving replica fell back to OP-Fence; a lost
  /// replica was dropped; a lost first replica handed its ops to the next one.
  std::string note;
};

/// Places `g` on the nodes of `c` whose `alive` entry is true, with c's placement policy:
/// `even` and OP-Fence (with or without replicas) run as at start on the survivors (OP-Fence
/// with `profile`'s measurements and the run's codecs `comp`); an explicit placement keeps its
/// assignments without the lost nodes (a lost replica is dropped, a lost first node is replaced
/// by its next surviving replica) and falls back to OP-Fence when an assignment has no
/// surviving node. `profile` covers every node of `c` (by index) and carries the run's
/// micro-batch count. Throws std::runtime_error when no node survives, placement_error when the
/// survivors cannot hold the model. OP-Fence judges plans under `schedule` (plan_compressed_run).
survivor_placement place_on_survivors(const graph& g, const cluster_spec& c, const cluster_profile& profile,
                                      const std::vector<bool>& alive, const compression_config& comp,
                                      std::optional<pipeline_schedule> schedule = std::nullopt);

/// The live scheduler's re-plan on the nodes that can take work (`usable`, by cluster node):
/// OP-Fence (the run's policy, est.cluster()'s) with `est`'s refinements restricted to those
/// nodes, in the whole cluster's node indices. Throws as place_on_survivors.
placement place_on_usable(const workload_estimator& est, const std::vector<bool>& usable,
                          const compression_config& comp, std::optional<pipeline_schedule> schedule = std::nullopt);

}  // namespace fusion
