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
//
// With stage replicas every replica of an op is an op actor of its own: each reports its gradient
// norm and takes the update, so the step waits for one report and one update per (op, replica).
// The replicas' gradients are the same all-reduced sum (bit-identical, actors/op_actor.cpp), so
// an op's squared norm is counted once, from replica 0; summing every replica's would count the
// op R times in the global norm and change the clipping.
//
// With local steps (train.sync=local:H, set_local_steps) each replica steps on its own
// gradients, so clipping is per replica: replica g's norm sums every op's squared norm of
// replica g mod R (an op with fewer replicas counts in each group its replica serves), and
// replica r of an op is clipped by the largest norm among the groups it serves (replica_norm).
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
  /// `replicas[id]` is how many replicas op `id` has (empty, or an entry below 1: one).
  void begin(uint64_t step, size_t micro_batches, std::vector<int> compute_ops, size_t graph_nodes,
             std::vector<int> replicas = {});

  /// Micro-batch `mb`'s loss.
  verdict on_loss(uint64_t step, uint32_t mb, double loss);
  /// Replica `replica` of op `id` reports its squared gradient norm, once its backward of every
  /// micro-batch routed through it (and the all-reduce) is done. Only replica 0's is counted.
  verdict on_grads(uint64_t step, int id, int replica, double squared_norm);
  /// The same for an op of one replica.
  verdict on_grads(uint64_t step, int id, double squared_norm) { return on_grads(step, id, 0, squared_norm); }
  /// Moves from forward_backward (complete) to update.
  void begin_update();
  /// One op actor applied its update; complete once every replica of every compute op has.
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
  /// sqrt of the summed squared norms, in graph-node order (deterministic); with local steps,
  /// the largest of the replicas' norms (replica_norms).
  double grad_norm() const;
  /// Local steps: every replica reports its own gradients and is clipped by its own norm. Kept
  /// across begin(); off by default.
  void set_local_steps(bool on) { local_ = on; }
  bool local_steps() const { return local_; }
  /// Local steps: the norm of replica group g for g < the largest replica count, over every
  /// op's replica g mod R (graph-node order). Without local steps: { grad_norm() }.
  std::vector<double> replica_norms() const;
  /// The norm that clips replica `replica` of op `id`: with local steps the largest
  /// replica_norms() entry among the groups g with g mod R(id) == replica; else grad_norm().
  double replica_norm(int id, int replica) const;
  /// Compute ops with a replica that has not reported a gradient norm yet, in id order.
  std::vector<int> waiting_for_grads() const;
  /// Compute ops that have not answered the update yet (counted, not named: replies carry no id).
  size_t updates_left() const { return updates_left_; }

 private:
  bool forward_backward_done() const { return n_loss_ == losses_.size() && n_grads_ == reports_expected_; }
  int replicas_of(int id) const { return replicas_[id]; }

  stage stage_ = stage::idle;
  uint64_t step_ = 0;
  std::vector<int> compute_;
  std::vector<double> losses_;
  std::vector<char> loss_in_;
  std::vector<double> sq_;          // by graph node id
  std::vector<std::vector<double>> replica_sq_;  // local steps: by graph node id, then replica
  bool local_ = false;
  std::vector<char> is_compute_;
  std::vector<int> replicas_;       // by graph node id
  std::vector<std::vector<char>> reported_;  // by graph node id, then replica
  size_t reports_expected_ = 0;     // one per (compute op, replica)
  size_t n_loss_ = 0, n_grads_ = 0, updates_left_ = 0;
};

}  // namespace fusion
