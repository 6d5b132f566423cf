// The schedule rule of one op actor (scheduler/schedule.hpp): which of its micro-batches may start
// their forward now, and whether its backwards may start. Under 1F1B an actor holding `limit`
// micro-batches of activations runs the forward of its k-th micro-batch (in its own micro-batch
// order) only once the backward of its (k - limit)-th is done; forwards that arrive earlier wait.
// Under GPipe (`forwards_first`) no backward starts before every forward of the step is done.
// Backwards always run in micro-batch order, so the gate changes when work runs, never what it
// computes. It also counts the peak of live micro-batches in a step (reported with the
// gradients). Plain C++, tested directly.
#pragma once

#include <algorithm>
#include <cstddef>

namespace fusion {

/// Forward and backward admission and live counting of one op actor for one step at a time.
class live_gate {
 public:
  /// A bound of `limit` live micro-batches (0: none); with `forwards_first`, no backward before
  /// `per_step` forwards (the actor's micro-batches of a step) are done. Counts cleared.
  explicit live_gate(size_t limit = 0, bool forwards_first = false, size_t per_step = 0)
      : limit_(limit), forwards_first_(forwards_first), per_step_(per_step) {}

  /// Whether the forward of the actor's micro-batch number `local_index` (0-based among the
  /// micro-batches it runs in a step) may start.
  bool may_forward(size_t local_index) const { return limit_ == 0 || local_index < backward_done_ + limit_; }
  /// Whether a backward may start.
  bool may_backward() const { return !forwards_first_ || forward_done_ >= per_step_; }
  /// A forward ran and saved its activations.
  void forward_done() {
    ++forward_done_;
    peak_ = std::max(peak_, ++live_);
  }
  /// A backward ran and released its activations.
  void backward_done() {
    ++backward_done_;
    if (live_ > 0) --live_;
  }
  /// The step's backward is over: the peak it reached, and the counts start again.
  size_t end_step() {
    const size_t peak = peak_;
    live_ = peak_ = forward_done_ = backward_done_ = 0;
    return peak;
  }

  size_t limit() const { return limit_; }
  bool forwards_first() const { return forwards_first_; }
  size_t live() const { return live_; }
  size_t peak() const { return peak_; }

 private:
  size_t limit_ = 0;
  bool forwards_first_ = false;
  size_t per_step_ = 0;
  size_t forward_done_ = 0, backward_done_ = 0;
  size_t live_ = 0, peak_ = 0;
};

}  // namespace fusion
