#include "core/step_machine.hpp"

#include <cmath>

namespace fusion {

void step_machine::begin(uint64_t step, size_t micro_batches, std::vector<int> compute_ops, size_t graph_nodes) {
  stage_ = stage::forward_backward;
  step_ = step;
  compute_ = std::move(compute_ops);
  losses_.assign(micro_batches, NAN);
  loss_in_.assign(micro_batches, 0);
  sq_.assign(graph_nodes, 0.0);
  is_compute_.assign(graph_nodes, 0);
  for (int id : compute_)
    if (id >= 0 && static_cast<size_t>(id) < graph_nodes) is_compute_[id] = 1;
  reported_.assign(graph_nodes, 0);
  n_loss_ = n_grads_ = updates_left_ = 0;
}

step_machine::verdict step_machine::on_loss(uint64_t step, uint32_t mb, double loss) {
  if (stage_ != stage::forward_backward || step != step_ || mb >= losses_.size() || loss_in_[mb])
    return verdict::refused;
  losses_[mb] = loss;
  loss_in_[mb] = 1;
  ++n_loss_;
  return forward_backward_done() ? verdict::complete : verdict::counted;
}

step_machine::verdict step_machine::on_grads(uint64_t step, int id, double squared_norm) {
  if (stage_ != stage::forward_backward || step != step_ || id < 0 || static_cast<size_t>(id) >= sq_.size() ||
      !is_compute_[id] || reported_[id])
    return verdict::refused;
  sq_[id] = squared_norm;
  reported_[id] = 1;
  ++n_grads_;
  return forward_backward_done() ? verdict::complete : verdict::counted;
}

void step_machine::begin_update() {
  stage_ = stage::update;
  updates_left_ = compute_.size();
}

step_machine::verdict step_machine::on_stepped() {
  if (stage_ != stage::update || updates_left_ == 0) return verdict::refused;
  if (--updates_left_ > 0) return verdict::counted;
  return verdict::complete;
}

void step_machine::reset() {
  stage_ = stage::idle;
  updates_left_ = 0;
}

double step_machine::mean_loss() const {
  double sum = 0;
  for (double l : losses_) sum += l;
  return losses_.empty() ? NAN : sum / static_cast<double>(losses_.size());
}

double step_machine::grad_norm() const {
  double sum = 0;
  for (double v : sq_) sum += v;
  return std::sqrt(sum);
}

std::vector<int> step_machine::waiting_for_grads() const {
  std::vector<int> out;
  for (size_t id = 0; id < reported_.size(); ++id)
    if (is_compute_[id] && !reported_[id]) out.push_back(static_cast<int>(id));
  return out;
}

}  // namespace fusion
