// The training step as a plain state machine, without actors: what the coordinator has heard of
// the step in flight and what it waits for next. The coordinator (actors/coordinator_train.cpp)
// feeds it the op actors' reports and does what it answers; tests drive it directly.
//
//   idle --begin--> forward_backward --(every loss and every op's gradient norm)--> update
//   update --(every op stepped)--> idle
//
// A report that does not belong to the step in flight (another step, an unknown micro-batch or
// op, a second report of the same one) is refused and changes nothing, so a late message of an
// abandoned step cannot complete the next one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusion {

/// The bookkeeping of one optimizer step over M micro-batches and a set of compute ops.
class step_machine {
 public:
  enum class stage : uint8_t { idle, forward_backward, update };

  /// What a report did.
  enum class verdict : uint8_t {
    refused,   ///< not of this step, out of range, or a repeat: ignored
    counted,   ///< recorded; still waiting
    complete,  ///< recorded, and the stage is done (forward_backward: every loss and gradient is in)
  };

  /// Starts step `step` (0-based) of `micro_batches` micro-batches; `compute_ops` are the graph
  /// node ids that report a gradient norm and take an update, `graph_nodes` the graph's size.
  void begin(uint64_t step, size_t micro_batches, std::vector<int> compute_ops, size_t graph_nodes);

  /// Micro-batch `mb`'s loss.
  verdict on_loss(uint64_t step, uint32_t mb, double loss);
  /// Op `id`'s squared gradient norm, once its backward of every micro-batch is done.
  verdict on_grads(uint64_t step, int id, double squared_norm);
  /// Moves from forward_backward (complete) to update.
  void begin_update();
  /// One op actor applied its update; complete once every compute op has.
  verdict on_stepped();
  /// Back to idle (the step ended or was abandoned).
  void reset();

  stage current() const { return stage_; }
  uint64_t step() const { return step_; }
  bool in_flight() const { return stage_ != stage::idle; }
  size_t losses_in() const { return n_loss_; }
  size_t micro_batches() const { return losses_.size(); }
  /// Mean loss over the micro-batches, summed in micro-batch order (deterministic).
  double mean_loss() const;
  /// sqrt of the summed squared norms, in graph-node order (deterministic).
  double grad_norm() const;
  /// Compute ops that have not reported a gradient norm yet, in id order.
  std::vector<int> waiting_for_grads() const;
  /// Compute ops that have not answered the update yet (counted, not named: replies carry no id).
  size_t updates_left() const { return updates_left_; }

 private:
  bool forward_backward_done() const { return n_loss_ == losses_.size() && n_grads_ == compute_.size(); }

  stage stage_ = stage::idle;
  uint64_t step_ = 0;
  std::vector<int> compute_;
  std::vector<double> losses_;
  std::vector<char> loss_in_;
  std::vector<double> sq_;          // by graph node id
  std::vector<char> is_compute_, reported_;
  size_t n_loss_ = 0, n_grads_ = 0, updates_left_ = 0;
};

}  // namespace fusion
