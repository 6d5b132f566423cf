// `train.micro-batches = auto`: the micro-batch count M the estimator predicts fastest among the
// divisors of the batch, within every node's memory (docs/scheduler.md, section 5).
//
// More micro-batches shrink the pipeline's bubble (the first and last stages idle while the
// pipeline fills and drains) but make every op's GEMMs smaller, which run at a lower rate; under
// 1F1B the activations alive per stage stay bounded by the stage count, not M. The trade is
// priced by simulating each candidate: the graph is loaded at the candidate's micro-batch rows,
// the profile's op times (measured at one micro-batch shape) are moved to the new shapes with a
// GEMM-efficiency model, the run's planner places it (OP-Fence re-plans per candidate: a plan
// costs milliseconds), and the estimator simulates the step under the run's schedule (or, with
// train.schedule = auto, the schedule choose_schedule picks for it).
//
// The efficiency model: an op over `rows` rows (its first input's elements over its last
// dimension: tokens for a transformer's linear layers, images for a convolution's batch) runs at
// a rate proportional to e(rows) = rows / (rows + half_rows), so its time at rows' is
//   t' = t * (rows' / rows) * e(rows) / e(rows').
// half_rows is the row count at which a device reaches half its peak GEMM rate (CPU and GPU
// constants in micro_batch_options; bench/RESULTS.md has the measurement). Optimizer updates do
// not depend on M and keep their time. Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

class workload_estimator;
struct estimator_options;

/// Settings of the choice.
struct micro_batch_options {
  int64_t max_micro_batches = 64;  ///< candidates above this are not considered
  /// Rows at which an op reaches half its peak rate (the efficiency model), by device kind.
  double cpu_half_rows = 8;
  double gpu_half_rows = 512;
};

/// The divisors of `batch` from 1 to `max` (ascending).
std::vector<int64_t> micro_batch_candidates(int64_t batch, int64_t max);

/// Rows of graph node `id`'s work: its first input's elements over that input's last dimension
/// (1 for an input node or a scalar).
double op_rows(const graph& g, int id);

/// e(rows) = rows / (rows + half_rows): the share of the peak rate an op of `rows` rows gets.
double gemm_efficiency(double rows, double half_rows);

/// Seconds of an op measured at `t` over `rows_from` rows, moved to `rows_to` rows.
double rescale_op_seconds(double t, double rows_from, double rows_to, double half_rows);

/// The profile of `p` (op times measured for graph `from`) for graph `to`, the same model at
/// another micro-batch: every op time of every node moved from its key in `from` to its key in
/// `to` by rescale_op_seconds (updates unchanged); micro_batch and micro_batches set to `to`'s
/// rows and `micro_batches`. Ops `from` lacks keep no time (the estimator falls back to op::cost).
cluster_profile rescale_profile(const cluster_profile& p, const graph& from, const graph& to, int micro_batches,
                                const micro_batch_options& o = {});

/// What one candidate is predicted to do.
struct micro_batch_prediction {
  int64_t micro_batches = 1;
  double step_s = 0;                    ///< predicted step time
  pipeline_schedule schedule = pipeline_schedule::eager;  ///< the schedule it was simulated under
  double peak_bytes = 0;                ///< the most memory any node needs
  std::string over_memory;              ///< "" when it fits; else which node and by how much
};

/// The choice among the candidates, and why.
struct micro_batch_choice {
  int64_t chosen = 1;
  std::vector<micro_batch_prediction> candidates;
  std::string reason;  ///< one line: the choice and why
};

/// Picks the fastest candidate that fits in memory; a tie (within 1%) goes to fewer
/// micro-batches (fewer messages, larger GEMMs). When none fits, the one needing the least
/// memory, and the reason says so. Throws std::invalid_argument on an empty list.
micro_batch_choice pick_micro_batches(std::vector<micro_batch_prediction> candidates);

/// "M=1 0.84 s, M=2 0.61 s, M=4 0.52 s, M=8 0.55 s (needs 3.1 GiB on n1, has 2 GiB)".
std::string format_candidates(const micro_batch_choice& c);

/// The graph of the model at `micro_rows` rows per micro-batch (load_graph of the run's file).
using graph_at_rows = std::function<graph(int64_t micro_rows)>;
/// The run's planner for a candidate: places the graph the estimator holds (OP-Fence re-plans).
using plan_for = std::function<plan(const workload_estimator& est, const cluster_profile& profile)>;

/// Predicts every candidate M (divisors of `batch` up to o.max_micro_batches) of a run whose op
/// times `measured` were profiled on graph `measured_graph`, and picks one (pick_micro_batches).
/// `fixed`: the run's train.schedule (nullopt: auto, choose_schedule per candidate). A candidate
/// the planner or estimator refuses (std::exception) is left out; if all are, throws the first
/// refusal.
micro_batch_choice choose_micro_batches(int64_t batch, const graph& measured_graph, const cluster_spec& c,
                                        const cluster_profile& measured, const graph_at_rows& graph_at,
                                        const plan_for& place, std::optional<pipeline_schedule> fixed,
                                        const estimator_options& eo, const micro_batch_options& o = {});

}  // namespace fusion
