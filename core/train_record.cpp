#include "core/train_record.hpp"

#include <algorithm>

namespace fusion {

namespace {

// Drops the oldest entries once there are more than `keep`, a sixteenth of `keep` more than
// needed, so that a long run does not move the whole history on every step.
template <class T>
void drop_oldest(std::vector<T>& v, size_t keep) {
  if (v.size() <= keep) return;
  size_t drop = std::min(v.size(), v.size() - keep + keep / 16);
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(drop));
}

}  // namespace

void add_step_record(train_result& r, step_record rec, size_t keep, size_t keep_measured) {
  r.steps.push_back(std::move(rec));
  ++r.steps_run;
  // Records before the last keep_measured lose their measurements newest first; the first one
  // found without any was stripped before, and so were all older ones.
  for (size_t i = r.steps.size() - std::min(r.steps.size(), keep_measured); i-- > 0;) {
    auto& old = r.steps[i];
    if (old.ops.empty() && old.edges.empty()) break;
    std::vector<op_measurement>{}.swap(old.ops);  // swap, not clear(): the capacity goes too
    std::vector<edge_measurement>{}.swap(old.edges);
  }
  drop_oldest(r.steps, keep);
}

void add_eval_record(train_result& r, int64_t step, const eval_result& v, size_t keep) {
  r.val_losses.emplace_back(step, v.loss);
  if (!std::isnan(v.accuracy)) r.val_accuracies.emplace_back(step, v.accuracy);
  if (!std::isnan(v.bits_per_byte)) r.val_bits_per_byte.emplace_back(step, v.bits_per_byte);
  drop_oldest(r.val_losses, keep);
  drop_oldest(r.val_accuracies, keep);
  drop_oldest(r.val_bits_per_byte, keep);
}

}  // namespace fusion
