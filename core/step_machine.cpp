#include "core/step_machine.hpp"

#include <algorithm>
#include <cmath>

namespace fusion {

void step_machine::begin(uint64_t step, size_t micro_batches, std::vector<int> compute_ops, size_t graph_nodes,
                         std::vector<int> replicas) {
  stage_ = stage::forward_backward;
  step_ = step;
  compute_ = std::move(compute_ops);
  losses_.assign(micro_batches, NAN);
  loss_in_.assign(micro_batches, 0);
  sq_.assign(graph_nodes, 0.0);
  is_compute_.assign(graph_nodes, 0);
  for (int id : compute_)
    if (id >= 0 && static_cast<size_t>(id) < graph_nodes) is_compute_[id] = 1;
  replicas_.assign(graph_nodes, 1);
  for (size_t id = 0; id < graph_nodes && id < replicas.size(); ++id) replicas_[id] = std::max(1, replicas[id]);
  reported_.assign(graph_nodes, {});
  replica_sq_.assign(graph_nodes, {});
  reports_expected_ = 0;
  for (size_t id = 0; id < graph_nodes; ++id) {
    reported_[id].assign(static_cast<size_t>(replicas_[id]), 0);
    replica_sq_[id].assign(static_cast<size_t>(replicas_[id]), 0.0);
    if (is_compute_[id]) reports_expected_ += static_cast<size_t>(replicas_[id]);
  }
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

step_machine::verdict step_machine::on_grads(uint64_t step, int id, int replica, double squared_norm) {
  if (stage_ != stage::forward_backward || step != step_ || id < 0 || static_cast<size_t>(id) >= sq_.size() ||
      !is_compute_[id] || replica < 0 || replica >= replicas_of(id) || reported_[id][replica])
    return verdict::refused;
  if (replica == 0) sq_[id] = squared_norm;
  replica_sq_[id][replica] = squared_norm;
  reported_[id][replica] = 1;
  ++n_grads_;
  return forward_backward_done() ? verdict::complete : verdict::counted;
}

void step_machine::begin_update() {
  stage_ = stage::update;
  updates_left_ = reports_expected_;
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
  if (local_) {
    const auto norms = replica_norms();
    return *std::max_element(norms.begin(), norms.end());
  }
  double sum = 0;
  for (double v : sq_) sum += v;
  return std::sqrt(sum);
}

std::vector<double> step_machine::replica_norms() const {
  if (!local_) return {grad_norm()};
  int groups = 1;
  for (size_t id = 0; id < replicas_.size(); ++id)
    if (is_compute_[id]) groups = std::max(groups, replicas_[id]);
  std::vector<double> out(static_cast<size_t>(groups), 0.0);
  for (int g = 0; g < groups; ++g) {
    double sum = 0;
    for (size_t id = 0; id < replica_sq_.size(); ++id)
      if (is_compute_[id]) sum += replica_sq_[id][static_cast<size_t>(g % replicas_[id])];
    out[static_cast<size_t>(g)] = std::sqrt(sum);
  }
  return out;
}

double step_machine::replica_norm(int id, int replica) const {
  if (!local_ || id < 0 || static_cast<size_t>(id) >= replicas_.size()) return grad_norm();
  const auto norms = replica_norms();
  double worst = 0;
  for (size_t g = 0; g < norms.size(); ++g)
    if (static_cast<int>(g) % replicas_[id] == replica) worst = std::max(worst, norms[g]);
  return worst;
}

std::vector<int> step_machine::waiting_for_grads() const {
  std::vector<int> out;
  for (size_t id = 0; id < reported_.size(); ++id)
    if (is_compute_[id] && std::find(reported_[id].begin(), reported_[id].end(), 0) != reported_[id].end())
      out.push_back(static_cast<int>(id));
  return out;
}

}  // namespace fusion
