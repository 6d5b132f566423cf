// What a call to session::train returns: the step and evaluation records the coordinator keeps
// for the session (core/metrics_record.hpp has the records and their metrics lines), bounded so
// that memory does not grow with the length of the run. Plain C++: no actors.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/metrics_record.hpp"

namespace fusion {

/// What a call to session::train returns.
struct train_result {
  /// The last step_records_kept steps of the call, oldest first; only the last
  /// measured_steps_kept of them keep their measurements (`ops`, `edges`). The metrics file
  /// (output.metrics) has every step in full.
  std::vector<step_record> steps;
  int64_t steps_run = 0;                                ///< steps done by the call
  std::vector<std::pair<int64_t, double>> val_losses;  ///< (step, validation loss)
  std::vector<std::pair<int64_t, double>> val_accuracies;  ///< (step, accuracy), when reported
  std::vector<std::pair<int64_t, double>> val_bits_per_byte;  ///< (step, bits per byte), text models
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

/// Appends an evaluation of step `step` (NaN accuracy or bits per byte: none reported) to
/// r.val_losses, r.val_accuracies and r.val_bits_per_byte, keeping the last `keep` of each.
void add_eval_record(train_result& r, int64_t step, const eval_result& v, size_t keep = step_records_kept);

}  // namespace fusion
