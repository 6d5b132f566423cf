// What a plan is predicted to cost, for people: per stage (a node and its ops) the predicted
// compute and memory, per cross-node edge the bytes and predicted transfer time, the predicted
// step time and tokens/s. fusion-cluster plan prints it (text or JSON); fusion-train prints it
// before training. Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

/// One stage on one node: a cluster node and the ops placed on it. With stage replicas, one
/// entry per replica (stage and replica say which).
struct stage_report {
  int node = -1;                 ///< cluster node index
  int stage = 0;                 ///< pipeline stage (index among the stages, in pipeline order)
  int replica = 0;               ///< which replica of the stage this node holds
  int replicas = 1;              ///< replicas of the stage
  int micro_batches = 0;         ///< micro-batches of a step routed through this node
  std::vector<int> ops;          ///< compute ops (graph ids, graph order)
  double compute_s = 0;          ///< predicted op seconds per step (all micro-batches, updates)
  double memory_bytes = 0;       ///< predicted bytes its ops hold
  double capacity_bytes = 0;     ///< the node's memory (0: unknown)
};

/// One graph edge whose ends sit on different nodes (the forward direction; the gradient of the
/// same size goes back); with replicas one per replica pair that a route joins.
struct cut_report {
  int producer = -1, consumer = -1;  ///< graph node ids
  int from = -1, to = -1;            ///< cluster node indices
  double bytes_per_micro_batch = 0;
  double mbit = 0;                   ///< the link's rate used for the prediction
  double transfer_s = 0;             ///< predicted seconds per step in one direction
};

/// A plan's prediction.
struct plan_report {
  std::vector<stage_report> stages;  ///< nodes with ops, in pipeline order (by first op)
  std::vector<int> idle_nodes;       ///< nodes without ops
  std::vector<cut_report> cuts;
  int nodes_used = 0;                ///< nodes that hold ops
  int stage_count = 0;               ///< pipeline stages (a replicated stage counts once)
  double allreduce_bytes = 0;        ///< step_estimate's all-reduce figures (0 without replicas)
  double allreduce_s = 0;
  double allreduce_exposed_s = 0;
  double step_s = 0;
  double pipeline_s = 0, optimizer_s = 0;
  double tokens_per_s = 0;           ///< tokens_per_step / step_s (images for an image model)
};

/// Builds the report of `p` under `est`; `tokens_per_step` is batch x graph::row_items.
plan_report report_plan(const workload_estimator& est, const plan& p, double tokens_per_step);

/// Throws placement_error when a stage of `r` needs more memory than its node has (a node of
/// unknown memory takes anything): names the cluster file, the node, both sizes and the stage's
/// ops, so that a plan no node could run (an even placement of a large model) is refused rather
/// than printed.
void check_plan_fits(const workload_estimator& est, const plan_report& r);

/// A printable table of the report: stages, cuts, then "predicted step X s, Y tokens/s" (images/s
/// for an image model).
std::string format_plan_report(const workload_estimator& est, const plan_report& r);

}  // namespace fusion
