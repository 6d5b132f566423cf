// The coordinator's workload estimator: built from the run's profile on the first step of a
// cluster run, it predicts every step of the current plan before it runs (predicted_step_s in
// the metrics) and learns from what every step measured (per-op times, per-edge transfers).
#include <cstdio>
#include <map>
#include <stdexcept>
#include <utility>

#include "actors/coordinator_state.hpp"
#include "core/log.hpp"
#include "scheduler/plan_report.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

namespace {

bool has_cluster(const coordinator_state& st) { return !st.in->cluster.nodes.empty(); }

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

workload_estimator* estimator_of(coord_ptr self) {
  auto& st = self->state;
  if (!has_cluster(st)) return nullptr;
  if (!st.exec.estimator) {
    cluster_profile p = st.exec.profile;
    if (p.nodes.size() != st.in->cluster.nodes.size()) p = profile_from_cluster(st.in->cluster);
    p.micro_batches = static_cast<int>(st.in->cfg.micro_batches);
    st.exec.estimator = std::make_unique<workload_estimator>(st.in->model, st.in->cluster, std::move(p));
  }
  return st.exec.estimator.get();
}

step_estimate predict_step(coord_ptr self) {
  auto* est = estimator_of(self);
  if (!est) return {};
  try {
    return est->simulate(self->state.exec.current);
  } catch (const std::exception& e) {
    // A prediction is informative only: a plan the estimator cannot simulate must not stop
    // training.
    log_warn("fusion-train", std::string("no step-time prediction: ") + e.what());
    return {};
  }
}

std::string describe_prediction(coord_ptr self) {
  auto* est = estimator_of(self);
  if (!est) return "";
  try {
    const auto& st = self->state;
    return "predicted from the profile:\n" +
           format_plan_report(*est, report_plan(*est, st.exec.current,
                                                static_cast<double>(st.in->cfg.batch * st.in->model.row_items)));
  } catch (const std::exception& e) {
    return std::string("no prediction: ") + e.what() + "\n";
  }
}

void choose_run_schedule(coord_ptr self) {
  auto& st = self->state;
  const std::string& asked = st.in->cfg.schedule;
  pipeline_schedule s = pipeline_schedule::eager;
  const bool fixed = parse_schedule(asked, s);
  if (!fixed && asked != "auto")
    throw std::runtime_error("train.schedule must be eager, gpipe, 1f1b or auto, got \"" + asked + "\"");
  // One process: no estimator, one stage, and auto keeps eager (choose_schedule says why).
  auto* est = estimator_of(self);
  if (!est) {
    st.exec.current.schedule = s;
    return;
  }
  const schedule_choice c = choose_schedule(*est, st.exec.current);
  if (!fixed) s = c.chosen;
  st.exec.current.schedule = s;
  if (st.in->cfg.progress)
    std::fprintf(stderr, "fusion-train: schedule %s (%s): %s%s\n", schedule_name(s), fixed ? "train.schedule" : "auto",
                 fixed ? "" : (c.reason + "; ").c_str(), format_predictions(c).c_str());
}

namespace {

// What capped nodes' processes spent beyond their ops, optimizer updates and ring work, against
// the bytes their cross-node edges carried: the per-byte host cost the simulation charges to
// their quota budgets (workload_estimator::traffic_s_per_byte). Uncapped nodes do that work on
// other cores and are left out, as are steps where migrated ops are still settling.
void observe_host_traffic(coord_ptr self, const step_record& rec) {
  auto* est = estimator_of(self);
  auto& st = self->state;
  for (auto& [op, until] : st.rebalance.settling)
    if (rec.step <= until) return;
  const auto& cluster = st.in->cluster;
  const placement& w = st.exec.current.where;
  const size_t K = cluster.nodes.size();
  std::vector<double> cpu(K, -1.0), known(K, 0.0), bytes(K, 0.0);
  for (auto& n : rec.nodes)
    if (int k = cluster.find_node(n.node); k >= 0) cpu[k] = n.cpu_s;
  for (auto& m : rec.ops) {
    if (m.node < 0 || static_cast<size_t>(m.node) >= w.node_of_op.size()) continue;
    for (size_t mb = 0; mb < m.forward_s.size() && mb < m.backward_s.size(); ++mb)
      known[w.node_of(m.node, w.replica_of(m.node, static_cast<int>(mb)))] += m.forward_s[mb] + m.backward_s[mb];
    for (int r = 0; r < w.replicas(m.node); ++r) {
      const int k = w.node_of(m.node, r);
      known[k] += est->update_s(m.node, k) + (r < static_cast<int>(m.reduce_work_s.size()) ? m.reduce_work_s[r] : 0.0);
    }
  }
  for (auto& e : rec.edges)
    for (const std::string* end : {&e.from_node, &e.to_node})
      if (int k = cluster.find_node(*end); k >= 0) bytes[k] += static_cast<double>(e.bytes);
  double host = 0, moved = 0;
  for (size_t k = 0; k < K; ++k)
    if (cpu[k] >= 0 && bytes[k] > 0 && est->quota_stretch(static_cast<int>(k)) > 1)
      host += cpu[k] - known[k], moved += bytes[k];
  est->observe_host_traffic(host, moved);
}

}  // namespace

void observe_step(coord_ptr self, const step_record& rec) {
  auto* est = estimator_of(self);
  // The first steps pay for first-touch allocations and cold caches (step 2 still ran about 30%
  // slow on the emulated sites): they would drag the averages.
  if (!est || rec.step <= 2) return;
  auto& st = self->state;
  const placement& w = st.exec.current.where;
  const auto& where = w.node_of_op;
  // Grouped by node: each node's correction factor moves once per step, over all its ops.
  std::map<int, std::vector<workload_estimator::op_sample>> by_node;
  for (auto& m : rec.ops) {
    if (m.node < 0 || static_cast<size_t>(m.node) >= where.size() || m.forward_s.empty()) continue;
    // A migrated op's first steps on its new node pay the same first-touch costs: measured, they
    // would make the new node look slow and the scheduler move the op again.
    if (auto it = st.rebalance.settling.find(m.node); it != st.rebalance.settling.end() && rec.step <= it->second) continue;
    // With replicas each micro-batch was timed on the node of the replica on its route.
    for (int r = 0; r < w.replicas(m.node); ++r) {
      std::vector<double> f, b;
      for (size_t mb = 0; mb < m.forward_s.size() && mb < m.backward_s.size(); ++mb)
        if (w.replica_of(m.node, static_cast<int>(mb)) == r) f.push_back(m.forward_s[mb]), b.push_back(m.backward_s[mb]);
      if (!f.empty()) by_node[w.node_of(m.node, r)].push_back({m.node, mean(f), mean(b)});
    }
    // Each replica's ring work teaches its node's host rate for the all-reduce.
    const int R = w.replicas(m.node);
    const double work_bytes = workload_estimator::ring_work_bytes(est->param_bytes(m.node), R);
    for (int r = 0; r < R && r < static_cast<int>(m.reduce_work_s.size()); ++r)
      est->observe_allreduce(w.node_of(m.node, r), work_bytes, m.reduce_work_s[r]);
  }
  for (auto& [node, samples] : by_node) est->observe_ops(node, samples);
  observe_host_traffic(self, rec);
  // A link carrying one tensor stream at a time times the link itself; with several edges in
  // flight on one node pair each tensor also waits for the others, which the simulation already
  // models as FIFO sharing, so those samples would count the sharing twice.
  // A ring hop is such a stream too, and often the only traffic between two replicas' nodes.
  std::map<std::pair<int, int>, std::vector<const edge_measurement*>> by_pair;
  for (const auto* list : {&rec.edges, &rec.reduce_edges})
    for (auto& e : *list) {
      int a = st.in->cluster.find_node(e.from_node), b = st.in->cluster.find_node(e.to_node);
      if (a >= 0 && b >= 0 && e.tensors > 0) by_pair[{a, b}].push_back(&e);
    }
  for (auto& [pair, edges] : by_pair) {
    if (edges.size() != 1) continue;
    const auto& e = *edges.front();
    double n = static_cast<double>(e.tensors);
    est->observe_transfer(pair.first, pair.second, static_cast<double>(e.bytes) / n, e.seconds / n,
                          static_cast<double>(e.idle_starts) / n);
  }
}

}  // namespace fusion
