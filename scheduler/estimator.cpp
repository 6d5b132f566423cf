// The workload estimator: op, link and memory costs from a profile (or op::cost), refined by
// moving averages of what a run measures. The step simulation is scheduler/estimator_simulate.cpp.
#include "scheduler/estimator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace fusion {

namespace {

bool is_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }


double ema(double old_value, double sample, double weight) { return old_value + weight * (sample - old_value); }

}  // namespace

workload_estimator::workload_estimator(const graph& g, const cluster_spec& c, cluster_profile profile,
                                       estimator_options options)
    : graph_(&g), cluster_(&c), profile_(std::move(profile)), options_(options) {
  if (profile_.nodes.size() != c.nodes.size())
    throw std::invalid_argument("workload estimator: the profile describes " + std::to_string(profile_.nodes.size()) +
                                " nodes but cluster '" + c.name + "' has " + std::to_string(c.nodes.size()) +
                                " (one profile entry per cluster node, in cluster order)");
  if (profile_.micro_batches < 1)
    throw std::invalid_argument("workload estimator: micro_batches must be at least 1, got " +
                                std::to_string(profile_.micro_batches));
  if (!(options_.ema_weight > 0 && options_.ema_weight <= 1))
    throw std::invalid_argument("workload estimator: ema_weight must be in (0, 1], got " +
                                std::to_string(options_.ema_weight));
  if (!(options_.local_mbit > 0))
    throw std::invalid_argument("workload estimator: local_mbit must be positive");

  ops_ = static_cast<int>(g.nodes.size());
  nodes_ = static_cast<int>(c.nodes.size());
  keys_.assign(ops_, "");
  costs_.assign(ops_, op_cost{});
  consumer_base_.assign(ops_ + 1, 0);
  slot_base_.assign(ops_ + 1, 0);
  for (auto& n : g.nodes) {
    consumer_base_[n.id + 1] = consumer_base_[n.id] + static_cast<int>(n.consumers.size());
    slot_base_[n.id + 1] = slot_base_[n.id] + static_cast<int>(n.inputs.size());
    if (n.is_input() || !n.impl) continue;
    keys_[n.id] = op_key(g, n.id);
    std::vector<shape_t> in;
    for (int i : n.inputs) in.push_back(g.nodes[i].shape);
    costs_[n.id] = n.impl->cost(in);
  }
  kept_copies_.assign(ops_, 0.0);
  for (auto& n : g.nodes)
    for (auto& end : n.consumers) {
      const graph_node& c = g.nodes[end.node];
      if (c.impl && c.impl->backward_reads_inputs()) kept_copies_[n.id] += 1;
    }
  // Where each (consumer, slot) sits among its producer's consumers: what a gradient travels on.
  index_at_producer_.assign(slot_base_[ops_], -1);
  for (auto& n : g.nodes)
    for (size_t j = 0; j < n.consumers.size(); ++j) {
      const graph_edge_end& end = n.consumers[j];
      index_at_producer_[slot_base_[end.node] + end.slot] = static_cast<int>(j);
    }

  base_fwd_.assign(static_cast<size_t>(ops_) * nodes_, 0.0);
  base_bwd_ = base_fwd_;
  base_upd_ = base_fwd_;
  for (int k = 0; k < nodes_; ++k) set_node_rates(k);
  correction_.assign(nodes_, 1.0);
  correction_seen_.assign(nodes_, 0);
  profiled_in_run_.assign(nodes_, 0);
  refresh_corrections();
  ring_s_per_byte_.assign(nodes_, -1.0);
  set_link_rates();
}

void workload_estimator::set_node_rates(int k) {
  const graph& g = *graph_;
  const node_profile& np = profile_.nodes[k];
    // A CPU node given a share of a core (cpu_share: other processes on it) gets that share of
    // the rates; one under a binding quota runs at full speed within its budget (simulate()); a
    // stated or measured gflops already describes the device as it runs.
    const double share = !is_gpu(np.device) && np.cpu_share > 0 && np.ops.empty() && !np.quota.binds()
                             ? std::min(np.cpu_share, 1.0)
                             : 1.0;
    const double flops_rate = (np.gflops > 0 ? np.gflops : options_.default_gflops * share) * 1e9;
    const double mem_rate = (is_gpu(np.device) ? options_.gpu_mem_gbs : options_.cpu_mem_gbs * share) * 1e9;
    for (auto& n : g.nodes) {
      if (keys_[n.id].empty()) continue;
      const size_t at = static_cast<size_t>(k) * ops_ + n.id;
      if (auto it = np.ops.find(keys_[n.id]); it != np.ops.end()) {
        base_fwd_[at] = it->second.forward_s;
        base_bwd_[at] = it->second.backward_s;
        base_upd_[at] = it->second.update_s;
        continue;
      }
      // Unmeasured: whichever of arithmetic and memory traffic is the bottleneck (roofline).
      const op_cost& cost = costs_[n.id];
      base_fwd_[at] = std::max(cost.flops_forward / flops_rate, cost.bytes_forward / mem_rate);
      base_bwd_[at] = std::max(cost.flops_backward / flops_rate, cost.bytes_backward / mem_rate);
      // AdamW reads and writes parameters, gradients and both moments.
      base_upd_[at] = cost.param_bytes * 4 / mem_rate;
    }
}

workload_estimator workload_estimator::restricted(const cluster_spec& sub, const std::vector<int>& full) const {
  cluster_profile p = profile_;
  p.nodes.clear();
  for (int k : full) p.nodes.push_back(profile_.nodes.at(k));
  workload_estimator out(*graph_, sub, std::move(p), options_);
  std::vector<int> index_of(nodes_, -1);
  for (size_t i = 0; i < full.size(); ++i) index_of[full[i]] = static_cast<int>(i);
  for (auto& [key, t] : measured_)
    if (index_of[key.second] >= 0) out.measured_[{key.first, index_of[key.second]}] = t;
  for (auto& [key, rate] : link_mbit_)
    if (index_of[key.first] >= 0 && index_of[key.second] >= 0) {
      const int a = index_of[key.first], b = index_of[key.second];
      out.link_mbit_[{std::min(a, b), std::max(a, b)}] = rate;
    }
  for (size_t i = 0; i < full.size(); ++i) {
    out.correction_[i] = correction_[full[i]];
    out.correction_seen_[i] = correction_seen_[full[i]];
    out.profiled_in_run_[i] = profiled_in_run_[full[i]];
    out.ring_s_per_byte_[i] = ring_s_per_byte_[full[i]];
  }
  out.refresh_corrections();
  out.traffic_s_per_byte_ = traffic_s_per_byte_;
  out.traffic_seen_ = traffic_seen_;
  return out;
}

void workload_estimator::admit_node(int node, const node_profile& np, const std::vector<link_profile>& links) {
  if (node < 0 || node >= nodes_)
    throw std::out_of_range("workload estimator: cannot admit cluster node " + std::to_string(node) + " (the cluster has " +
                            std::to_string(nodes_) + ")");
  profile_.nodes[node] = np;
  for (auto& l : links) {
    bool found = false;
    for (auto& mine : profile_.links)
      if ((mine.site_a == l.site_a && mine.site_b == l.site_b) || (mine.site_a == l.site_b && mine.site_b == l.site_a)) {
        mine = l;
        found = true;
      }
    if (!found) profile_.links.push_back(l);
  }
  set_node_rates(node);
  set_link_rates();
  // What was measured on the node before (a node that left or was lost comes back as a new
  // process, maybe on another machine) no longer describes it.
  std::erase_if(measured_, [node](const auto& kv) { return kv.first.second == node; });
  std::erase_if(link_mbit_, [node](const auto& kv) { return kv.first.first == node || kv.first.second == node; });
  correction_[node] = 1.0;
  correction_seen_[node] = 0;
  profiled_in_run_[node] = 1;
  refresh_corrections();
  ring_s_per_byte_[node] = -1.0;
}

void workload_estimator::set_link_rates() {
  const cluster_spec& c = *cluster_;
  base_mbit_.assign(static_cast<size_t>(nodes_) * nodes_, options_.local_mbit);
  base_rtt_.assign(static_cast<size_t>(nodes_) * nodes_, options_.local_rtt_s);
  for (int a = 0; a < nodes_; ++a)
    for (int b = 0; b < nodes_; ++b) {
      const size_t at = static_cast<size_t>(a) * nodes_ + b;
      if (a == b) {
        base_mbit_[at] = std::numeric_limits<double>::infinity();
        base_rtt_[at] = 0;
        continue;
      }
      int sa = c.nodes[a].site_index >= 0 ? c.nodes[a].site_index : c.find_site(c.nodes[a].site);
      int sb = c.nodes[b].site_index >= 0 ? c.nodes[b].site_index : c.find_site(c.nodes[b].site);
      if (sa == sb) continue;
      // Sites without a probed or configured link are unshaped: they talk at the local rate.
      const link_profile* l = profile_.find_link(sa, sb);
      if (!l || !(l->mbit > 0)) continue;
      base_mbit_[at] = l->mbit;
      if (l->rtt_s > 0) base_rtt_[at] = l->rtt_s;
    }
}

double workload_estimator::profile_forward_s(int id, int node) const {
  return base_fwd_[static_cast<size_t>(node) * ops_ + id];
}

double workload_estimator::profile_backward_s(int id, int node) const {
  return base_bwd_[static_cast<size_t>(node) * ops_ + id];
}

namespace {

void check_op(int id, int ops, int node, int nodes, const char* what) {
  if (id < 0 || id >= ops || node < 0 || node >= nodes)
    throw std::out_of_range(std::string("workload estimator: ") + what + " of graph node " + std::to_string(id) +
                            " on cluster node " + std::to_string(node) + " (the graph has " + std::to_string(ops) +
                            " nodes, the cluster " + std::to_string(nodes) + ")");
}

}  // namespace

double workload_estimator::forward_s(int id, int node) const {
  check_op(id, ops_, node, nodes_, "forward time");
  if (keys_[id].empty()) return 0;
  if (!measured_.empty())
    if (auto it = measured_.find({id, node}); it != measured_.end()) return it->second.first;
  return profile_forward_s(id, node) * correction_of(node);
}

double workload_estimator::backward_s(int id, int node) const {
  check_op(id, ops_, node, nodes_, "backward time");
  if (keys_[id].empty()) return 0;
  if (!measured_.empty())
    if (auto it = measured_.find({id, node}); it != measured_.end()) return it->second.second;
  return profile_backward_s(id, node) * correction_of(node);
}

bool workload_estimator::set_quota(int node, const cpu_quota& quota) {
  check_op(0, 1, node, nodes_, "quota");
  node_profile& np = profile_.nodes[node];
  // A quota of a core or more holds no serial op runner back: the same as none.
  auto binding = [](const cpu_quota& q) { return q.binds() ? q : cpu_quota{}; };
  if (is_gpu(np.device) || binding(np.quota) == binding(quota)) return false;
  np.quota = binding(quota);
  set_node_rates(node);  // the rates of untimed ops take the CPU share only without a binding quota
  return true;
}

double workload_estimator::correction_of(int node) const { return node_correction_[node]; }

void workload_estimator::refresh_corrections() {
  // A node that ran nothing yet: what the measured nodes of its kind showed about their profiles
  // (profiles are taken one node at a time; a run shares the machines), else 1. Without this an
  // idle node looks faster than the busy ones by exactly that margin, and work moved there comes
  // back slower than predicted. Not a node admitted mid-run: its profile was timed while the run
  // shared the machines (its ops stretched by the CPU share it got), so it already holds that
  // margin; the mean of a throttled job would count it twice and hide the newcomer's speed. Kept
  // per node rather than summed at each lookup: the planners ask for op times millions of times
  // per plan.
  double sum[2] = {0, 0};
  int n[2] = {0, 0};
  for (int k = 0; k < nodes_; ++k)
    if (correction_seen_[k]) {
      const int kind = is_gpu(profile_.nodes[k].device) ? 1 : 0;
      sum[kind] += correction_[k], ++n[kind];
    }
  node_correction_.assign(nodes_, 1.0);
  for (int k = 0; k < nodes_; ++k) {
    const int kind = is_gpu(profile_.nodes[k].device) ? 1 : 0;
    node_correction_[k] = correction_seen_[k]     ? correction_[k]
                          : profiled_in_run_[k] ? 1.0
                          : n[kind]             ? sum[kind] / n[kind]
                                                : 1.0;
  }
}

double workload_estimator::update_s(int id, int node) const {
  check_op(id, ops_, node, nodes_, "update time");
  return base_upd_[static_cast<size_t>(node) * ops_ + id];
}

double workload_estimator::step_compute_s(int id, int node) const {
  return (micro_batches() * (forward_s(id, node) + backward_s(id, node)) + update_s(id, node)) * quota_stretch(node);
}

double workload_estimator::quota_stretch(int node) const {
  check_op(0, 1, node, nodes_, "CPU quota");
  const node_profile& np = profile_.nodes[node];
  return !is_gpu(np.device) && np.quota.binds() ? 1 / np.quota.cores : 1.0;
}

double workload_estimator::link_mbit(int a, int b) const {
  check_op(0, 1, a, nodes_, "link rate");
  check_op(0, 1, b, nodes_, "link rate");
  if (a == b) return std::numeric_limits<double>::infinity();
  if (!link_mbit_.empty())
    if (auto it = link_mbit_.find({std::min(a, b), std::max(a, b)}); it != link_mbit_.end()) return it->second;
  return base_mbit_[static_cast<size_t>(a) * nodes_ + b];
}

double workload_estimator::link_rtt_s(int a, int b) const {
  check_op(0, 1, a, nodes_, "link round trip");
  check_op(0, 1, b, nodes_, "link round trip");
  return base_rtt_[static_cast<size_t>(a) * nodes_ + b];
}

double workload_estimator::transfer_s(double bytes, int a, int b) const {
  if (a == b) return 0;
  return bytes * 8 / (link_mbit(a, b) * 1e6) + link_rtt_s(a, b) / 2;
}

double workload_estimator::output_bytes(int id) const {
  check_op(id, ops_, 0, 1, "output bytes");
  const graph_node& n = graph_->nodes[id];
  return static_cast<double>(numel_of(n.shape)) * static_cast<double>(dtype_size(n.type));
}

double workload_estimator::param_bytes(int id) const {
  check_op(id, ops_, 0, 1, "parameter bytes");
  return keys_[id].empty() ? 0 : costs_[id].param_bytes;
}

double workload_estimator::state_bytes(int id) const {
  check_op(id, ops_, 0, 1, "state");
  return keys_[id].empty() ? 0 : 3 * costs_[id].param_bytes;
}

double workload_estimator::memory_bytes(int id) const {
  check_op(id, ops_, 0, 1, "memory");
  if (keys_[id].empty()) return 0;
  return 4 * costs_[id].param_bytes + micro_batches() * activation_bytes(id);
}

double workload_estimator::activation_bytes(int id) const {
  check_op(id, ops_, 0, 1, "activation bytes");
  if (keys_[id].empty()) return 0;
  return (1 + kept_copies_[id]) * output_bytes(id);
}

void workload_estimator::observe_op(int id, int node, double fwd, double bwd) { observe_ops(node, {{id, fwd, bwd}}); }

void workload_estimator::observe_ops(int node, const std::vector<op_sample>& ops) {
  check_op(0, 1, node, nodes_, "measurement");
  const double w = options_.ema_weight;
  for (const auto& o : ops) check_op(o.id, ops_, node, nodes_, "measurement");
  double measured_sum = 0, predicted_sum = 0;
  for (const auto& o : ops) {
    const double fwd = o.forward_s, bwd = o.backward_s;
    if (keys_[o.id].empty() || !std::isfinite(fwd) || !std::isfinite(bwd) || fwd < 0 || bwd < 0) continue;
    auto [it, fresh] = measured_.try_emplace({o.id, node}, fwd, bwd);
    if (!fresh) {
      it->second.first = ema(it->second.first, fwd, w);
      it->second.second = ema(it->second.second, bwd, w);
    }
    const double predicted = profile_forward_s(o.id, node) + profile_backward_s(o.id, node);
    if (predicted > 0 && fwd + bwd > 0) measured_sum += fwd + bwd, predicted_sum += predicted;
  }
  // The node as a whole runs faster or slower than profiled (load, throttling, a stale profile):
  // its ops that were never measured there follow.
  if (predicted_sum > 0) {
    correction_[node] = ema(correction_[node], measured_sum / predicted_sum, w);
    correction_seen_[node] = 1;
    refresh_corrections();
  }
}

void workload_estimator::observe_transfer(int a, int b, double bytes, double seconds, double round_trips) {
  check_op(0, 1, a, nodes_, "transfer");
  check_op(0, 1, b, nodes_, "transfer");
  if (a == b || !(bytes > 0) || !(seconds > 0) || !std::isfinite(bytes) || !std::isfinite(seconds)) return;
  if (!(round_trips >= 0 && round_trips <= 1)) round_trips = 1;
  // The round trip is kept: what remains after the round trips the timing held is serialisation
  // at the link's rate, what the simulation charges the link (the half round trip to the
  // receiver overlaps the next tensor). The floor keeps a round trip guessed too long from
  // turning a sample into an absurd rate.
  const double busy = std::max(seconds - round_trips * link_rtt_s(a, b), 0.1 * seconds);
  const double rate = bytes * 8 / busy / 1e6;
  auto [it, fresh] = link_mbit_.try_emplace({std::min(a, b), std::max(a, b)}, rate);
  if (!fresh) it->second = ema(it->second, rate, options_.ema_weight);
}

double workload_estimator::ring_work_bytes(double param_bytes, int replicas) {
  if (replicas < 2 || !(param_bytes > 0)) return 0;
  return param_bytes * (2 + 4.0 * (replicas - 1) / replicas);
}

double workload_estimator::ring_s_per_byte(int node) const {
  check_op(0, 1, node, nodes_, "ring work");
  if (ring_s_per_byte_[node] >= 0) return ring_s_per_byte_[node];
  // A capped node (0.3 of a core) copies and adds at that share of a core's rate.
  const double share = profile_.nodes[node].cpu_share;
  const double cores = share > 0 ? std::min(share, 1.0) : 1.0;
  return 1 / (options_.ring_host_gbs * 1e9 * cores);
}

void workload_estimator::observe_allreduce(int node, double work_bytes, double work_s) {
  check_op(0, 1, node, nodes_, "ring work");
  if (!(work_bytes > 0) || !(work_s > 0) || !std::isfinite(work_bytes) || !std::isfinite(work_s)) return;
  const double rate = work_s / work_bytes;
  double& at = ring_s_per_byte_[node];
  at = at < 0 ? rate : ema(at, rate, options_.ema_weight);
}

void workload_estimator::observe_host_traffic(double host_s, double bytes) {
  // Below a few hundred KiB the residual is mostly noise of the node's CPU clock and its fixed
  // per-step work, not traffic.
  if (!(bytes >= 256 * 1024) || !std::isfinite(host_s) || !std::isfinite(bytes)) return;
  // What the ops' times miss is never negative; above 50 ns a byte (20 MB/s of host work) it is
  // not traffic but something the run did once (a compile, a page-in).
  const double rate = std::clamp(host_s, 0.0, 50e-9 * bytes) / bytes;
  traffic_s_per_byte_ = traffic_seen_ ? ema(traffic_s_per_byte_, rate, options_.ema_weight) : rate;
  traffic_seen_ = true;
}

std::pair<std::vector<double>, std::vector<double>> workload_estimator::node_phase_s(const plan& p) const {
  std::vector<double> forward(nodes_, 0.0), backward(nodes_, 0.0);
  for (auto& n : graph_->nodes) {
    if (keys_[n.id].empty()) continue;
    for (int r = 0; r < p.where.replicas(n.id); ++r) {
      const int k = p.where.node_of(n.id, r);
      forward[k] += forward_s(n.id, k) * quota_stretch(k);
      backward[k] += backward_s(n.id, k) * quota_stretch(k);
    }
  }
  return {std::move(forward), std::move(backward)};
}

double workload_estimator::feed_interval_s(const plan& p) const {
  const placement& w = p.where;
  if (w.stages.empty()) {
    int first = -1;
    bool spread = false;
    for (auto& n : graph_->nodes) {
      if (keys_[n.id].empty()) continue;
      const int k = w.node_of_op.at(n.id);
      if (first < 0) first = k;
      spread = spread || k != first;
    }
    if (!spread) return 0.0;
    const auto forward = node_phase_s(p).first;
    return *std::max_element(forward.begin(), forward.end());
  }
  // With replicas a stage takes micro-batches at the sum of its replicas' rates: the pace is the
  // slowest stage's 1 / sum(1 / forward seconds). One stage (however many replicas) is not a
  // pipeline: everything is fed at once.
  std::vector<char> computes(w.stages.size(), 0);
  for (auto& n : graph_->nodes)
    if (!keys_[n.id].empty()) computes[w.stage_of(n.id)] = 1;
  if (std::count(computes.begin(), computes.end(), 1) < 2) return 0.0;
  const auto forward = node_phase_s(p).first;
  double pace = 0;
  for (size_t s = 0; s < w.stages.size(); ++s) {
    double rate = 0;
    for (int k : w.stages[s].nodes)
      if (forward[k] > 0) rate += 1 / forward[k];
    if (rate > 0) pace = std::max(pace, 1 / rate);
  }
  return pace;
}

}  // namespace fusion
