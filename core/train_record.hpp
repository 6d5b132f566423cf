// What a training run measured, step by step: the records the coordinator keeps for the session
// (train_result) and writes to the metrics file, bounded so that memory does not grow with the
// length of the run. Plain C++: no actors.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fusion {

/// Measured work of one operator in one step (kept for the scheduler, written to the metrics).
struct op_measurement {
  int node = -1;                       ///< graph node id
  std::vector<double> forward_s;       ///< per micro-batch
  std::vector<double> backward_s;      ///< per micro-batch
};

/// Measured traffic of one cross-process edge in one step.
struct edge_measurement {
  int producer = -1, consumer = -1;    ///< graph node ids
  bool forward = true;                 ///< activation (true) or gradient (false)
  std::string from_node, to_node;      ///< cluster node names
  uint64_t bytes = 0;                  ///< on the wire (compressed payloads when the edge encodes)
  uint64_t dense_bytes = 0;            ///< the same tensors uncompressed
  uint64_t tensors = 0;
  double seconds = 0;                  ///< summed send-to-acknowledge time of those tensors
  double encode_s = 0;                 ///< summed compression time of those tensors
  double keep_ratio = 1;               ///< the edge's keep ratio when it last sent (1: dense)
};

/// One optimizer step's record.
struct step_record {
  int64_t step = 0;        ///< 1-based: the number of steps done after this one
  double loss = 0;         ///< mean training loss of the global batch
  double lr = 0;
  double grad_norm = 0;    ///< before clipping
  double tokens_per_s = 0; ///< of this step
  double step_s = 0;       ///< wall time of this step, feed to the last optimizer update
  double predicted_step_s = 0; ///< the workload estimator's prediction before the step (0: none)
  std::vector<op_measurement> ops;     ///< every compute op
  std::vector<edge_measurement> edges; ///< every cross-process edge that carried data
};

/// What one evaluation pass measured (NaN: not measured).
struct eval_result {
  double loss = NAN;       ///< mean loss over the evaluation batches
  double accuracy = NAN;   ///< correct / predictions, when the loss op reports "accuracy"
};

/// What a call to session::train returns.
struct train_result {
  /// The last step_records_kept steps of the call, oldest first; only the last
  /// measured_steps_kept of them keep their measurements (`ops`, `edges`). The metrics file
  /// (output.metrics) has every step in full.
  std::vector<step_record> steps;
  int64_t steps_run = 0;                                ///< steps done by the call
  std::vector<std::pair<int64_t, double>> val_losses;  ///< (step, validation loss)
  std::vector<std::pair<int64_t, double>> val_accuracies;  ///< (step, accuracy), when reported
  double tokens_per_s = 0;                              ///< over the whole call (images/s for
                                                        ///< an image model: rows x row_items)
  double seconds = 0;
  double peak_rss_mb = 0;
  bool interrupted = false;                             ///< stopped early by stop_flag
};

/// How many of the most recent steps and evaluations a train_result keeps. The coordinator
/// writes every one to the metrics file as it ends; what stays in memory must not grow with the
/// length of the run (about 100 bytes a step: 10 MiB at most).
inline constexpr size_t step_records_kept = 100000;
/// How many of the kept steps keep their per-op and per-edge measurements (about 9 KiB a step
/// for gpt-char-small's 61 compute ops: keeping them all grew a 1,000-step run by 9 MiB).
inline constexpr size_t measured_steps_kept = 8;

/// Appends a finished step to r.steps (counting it in r.steps_run) and drops what falls out of
/// the bounds: the oldest records beyond `keep`, the measurements of those before the last
/// `keep_measured`. Constant time per step (amortized).
void add_step_record(train_result& r, step_record rec, size_t keep = step_records_kept,
                     size_t keep_measured = measured_steps_kept);

/// Appends an evaluation of step `step` (NaN accuracy: none reported) to r.val_losses and
/// r.val_accuracies, keeping the last `keep` of each.
void add_eval_record(train_result& r, int64_t step, const eval_result& v, size_t keep = step_records_kept);

}  // namespace fusion
