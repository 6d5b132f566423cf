// What a training step and an evaluation measured, and the JSON lines the metrics file
// (output.metrics, docs/training.md) holds for them: "step", "eval" and AdaTopK's "compression"
// records. Plain C++ (no CAF): the coordinator fills these and writes the lines.
//
// Every line is one JSON object in the layout the file has always had (", " and ": " between
// items, so `grep '"type": "step", "step": 3'` keeps working), keys in a fixed order; names are
// escaped as JSON strings, so any op, node or link name gives a line that parses.
// Shape legend: none.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fusion {

struct graph;  // core/graph.hpp

/// Measured work of one operator in one step (kept for the scheduler, written to the metrics).
struct op_measurement {
  int node = -1;                       ///< graph node id
  std::vector<double> forward_s;       ///< per micro-batch
  std::vector<double> backward_s;      ///< per micro-batch
  /// The most micro-batches of activations its actor held at once (the largest over its
  /// replicas; 0: not reported). 1F1B bounds it by stages - position (scheduler/schedule.hpp).
  int peak_live = 0;
  /// Stage replicas (empty with one replica): per replica, the seconds from its last backward to
  /// its gradient all-reduce done, and the seconds of that the op actor spent working on the ring
  /// (flattening, copying chunks, adding, unflattening).
  std::vector<double> reduce_s;
  std::vector<double> reduce_work_s;
  uint64_t reduce_bytes = 0;           ///< all-reduce bytes its replicas sent (every ring hop)
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
  /// Of `tensors`, those timed from their own first chunk (the edge was idle): each of their
  /// times holds a round trip; the others were timed from the previous tensor's acknowledgement.
  uint64_t idle_starts = 0;
};

/// The CPU a node process used during one step (cluster runs).
struct node_measurement {
  std::string node;                    ///< cluster node name
  double cpu_s = 0;                    ///< user and system seconds of every thread, poll to poll
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
  /// Idle time at the step boundary before this step: from the previous step's last optimizer
  /// reply to this step's first micro-batch fed (0 for the first step of a run).
  double boundary_s = 0;
  /// The optimizer update of this step (part of step_s): from the coordinator's update requests,
  /// sent once every gradient norm is in, to the last op's reply.
  double update_s = 0;
  /// Stage replicas (0 without): all-reduce bytes sent by every replica of every op, the seconds
  /// of ring work summed over them, and the exposed seconds: from the step's last backward to its
  /// last all-reduce done (what the backward did not hide; step_estimate::allreduce_exposed_s).
  uint64_t allreduce_bytes = 0;
  double allreduce_work_s = 0;
  double allreduce_exposed_s = 0;
  std::vector<op_measurement> ops;     ///< every compute op
  std::vector<edge_measurement> edges; ///< every cross-process edge that carried data
  /// Every gradient ring hop that carried data (producer = consumer = the op, forward false):
  /// for the estimator's links; not in the metrics line (its bytes are allreduce_bytes).
  std::vector<edge_measurement> reduce_edges;
  std::vector<node_measurement> nodes; ///< every node polled at the step's end (cluster runs)
};

/// What one evaluation pass measured (NaN: not measured).
struct eval_result {
  double loss = NAN;       ///< mean loss over the evaluation batches
  double accuracy = NAN;   ///< correct / predictions, when the loss op reports "accuracy"
  double bits_per_byte = NAN;  ///< text: loss in bits per byte of text, comparable across tokenizers
};

/// One change of a link's AdaTopK rung (actors/coordinator_compress.cpp).
struct compression_change {
  int64_t step = 0;
  std::string link;          ///< scheduler/compression_plan.hpp link_group_name: "a1 -> b1 fwd"
  double keep_before = 1;    ///< the rungs' levels (compression/adaptive.hpp)
  double keep_after = 1;
  double mbit = 0;           ///< the link's rate in Mbit/s
  uint64_t dense_bytes = 0;  ///< what the link's edges carry per micro-batch uncompressed
  double budget_s = 0;       ///< the slowest stage's time, which the link should stay under
  std::string codec_before;  ///< the rungs in words (level_name): "f16 keep-all", "int8 /64"
  std::string codec_after;
  std::string reason;        ///< the rule's reason (rung_choice::reason)
};

/// `t` as ISO 8601 in UTC with milliseconds, "2026-01-31T12:34:56.789Z": the "time" of records.
std::string metrics_time(std::chrono::system_clock::time_point t = std::chrono::system_clock::now());

/// {"type": "step", "step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s",
/// "predicted_step_s", "boundary_s", "update_s", ["allreduce_bytes", "allreduce_work_s", "allreduce_exposed_s": only
/// with replicas,] "elapsed_s", "time", "ops": {OP: {"fwd_ms": [...], "bwd_ms": [...][, "reduce_ms": [...],
/// "reduce_work_ms": [...], "reduce_bytes": only for a replicated op, one entry per replica]}},
/// "edges": [{"from", "to", "edge": "PRODUCER->CONSUMER", "dir": "fwd"|"bwd", "bytes",
/// "dense_bytes", "tensors", "seconds", "encode_s", "keep_ratio"}][, "node_cpu_s": {NODE: seconds}:
/// only when nodes were polled]}, op names from `g` by node id. `elapsed_s`: seconds of training
/// so far; `time`: metrics_time().
std::string step_metrics_line(const step_record& rec, const graph& g, double elapsed_s, const std::string& time);

/// {"type": "eval", "step", "val_loss", "val_accuracy", "val_bpb" (each only when measured), "time"}.
std::string eval_metrics_line(int64_t step, const eval_result& v, const std::string& time);

/// {"type": "compression", "step", "link", "keep_before", "keep_after", "mbit", "dense_bytes",
/// "budget_s", "codec_before", "codec_after", "reason"}.
std::string compression_metrics_line(const compression_change& c);

}  // namespace fusion
