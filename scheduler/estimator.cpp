// The workload estimator: op, link and memory costs from a profile (or op::cost), refined by
// moving averages of what a run measures, and a discrete-event simulation of one training step
// that follows the runtime's schedule (docs/distributed.md, actors/op_actor.cpp).
#include "scheduler/estimator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

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
  for (int k = 0; k < nodes_; ++k) {
    const node_profile& np = profile_.nodes[k];
    // A CPU node capped at a share of a core (cpu_share) gets that share of the rates; a stated
    // or measured gflops already describes the device as it runs.
    const double share = !is_gpu(np.device) && np.cpu_share > 0 && np.ops.empty() ? std::min(np.cpu_share, 1.0) : 1.0;
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
  correction_.assign(nodes_, 1.0);
  correction_seen_.assign(nodes_, 0);

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

double workload_estimator::correction_of(int node) const {
  if (correction_seen_[node]) return correction_[node];
  // A node that ran nothing yet: what the measured nodes of its kind showed about their profiles
  // (profiles are taken one node at a time; a run shares the machines), else 1. Without this an
  // idle node looks faster than the busy ones by exactly that margin, and work moved there comes
  // back slower than predicted.
  double sum = 0;
  int n = 0;
  for (int k = 0; k < nodes_; ++k)
    if (correction_seen_[k] && is_gpu(profile_.nodes[k].device) == is_gpu(profile_.nodes[node].device))
      sum += correction_[k], ++n;
  return n ? sum / n : 1.0;
}

double workload_estimator::update_s(int id, int node) const {
  check_op(id, ops_, node, nodes_, "update time");
  return base_upd_[static_cast<size_t>(node) * ops_ + id];
}

double workload_estimator::step_compute_s(int id, int node) const {
  return micro_batches() * (forward_s(id, node) + backward_s(id, node)) + update_s(id, node);
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

double workload_estimator::state_bytes(int id) const {
  check_op(id, ops_, 0, 1, "state");
  return keys_[id].empty() ? 0 : 3 * costs_[id].param_bytes;
}

double workload_estimator::memory_bytes(int id) const {
  check_op(id, ops_, 0, 1, "memory");
  if (keys_[id].empty()) return 0;
  return 4 * costs_[id].param_bytes + 2.0 * micro_batches() * output_bytes(id);
}

void workload_estimator::observe_op(int id, int node, double fwd, double bwd) {
  check_op(id, ops_, node, nodes_, "measurement");
  if (keys_[id].empty() || !std::isfinite(fwd) || !std::isfinite(bwd) || fwd < 0 || bwd < 0) return;
  const double w = options_.ema_weight;
  auto [it, fresh] = measured_.try_emplace({id, node}, fwd, bwd);
  if (!fresh) {
    it->second.first = ema(it->second.first, fwd, w);
    it->second.second = ema(it->second.second, bwd, w);
  }
  // The node as a whole runs faster or slower than profiled (load, throttling, a stale profile):
  // its ops that were never measured there follow.
  const double predicted = profile_forward_s(id, node) + profile_backward_s(id, node);
  if (predicted > 0 && fwd + bwd > 0) {
    correction_[node] = ema(correction_[node], (fwd + bwd) / predicted, w);
    correction_seen_[node] = 1;
  }
}

void workload_estimator::observe_transfer(int a, int b, double bytes, double seconds) {
  check_op(0, 1, a, nodes_, "transfer");
  check_op(0, 1, b, nodes_, "transfer");
  if (a == b || !(bytes > 0) || !(seconds > 0) || !std::isfinite(bytes) || !std::isfinite(seconds)) return;
  // The round trip is kept: what remains after half of it is serialisation at the link's rate.
  // The floor keeps a round trip guessed too long from turning a sample into an absurd rate.
  const double busy = std::max(seconds - link_rtt_s(a, b) / 2, 0.1 * seconds);
  const double rate = bytes * 8 / busy / 1e6;
  auto [it, fresh] = link_mbit_.try_emplace({std::min(a, b), std::max(a, b)}, rate);
  if (!fresh) it->second = ema(it->second, rate, options_.ema_weight);
}

namespace {

// A task is (op, micro-batch, direction): index (op * M + m) * 2 + (backward ? 1 : 0).
struct sim_event {
  double time;
  uint64_t seq;   // insertion order: events at one time are handled first come, first served
  int task;
  bool done;      // completion (true) or became ready (false)
  bool operator>(const sim_event& o) const { return std::tie(time, seq) > std::tie(o.time, o.seq); }
};

// What a node picks among its ready tasks: earliest ready, then micro-batch, forward before
// backward, graph order.
struct ready_key {
  double ready;
  int m, dir, op, task;
  bool operator>(const ready_key& o) const {
    return std::tie(ready, m, dir, op) > std::tie(o.ready, o.m, o.dir, o.op);
  }
};

template <class T>
using min_queue = std::priority_queue<T, std::vector<T>, std::greater<T>>;

}  // namespace

step_estimate workload_estimator::simulate(const plan& p) const {
  const graph& g = *graph_;
  const placement& pw = p.where;
  const auto& where = pw.node_of_op;
  if (static_cast<int>(where.size()) != ops_)
    throw std::invalid_argument("workload estimator: the plan places " + std::to_string(where.size()) +
                                " graph nodes but model '" + g.name + "' has " + std::to_string(ops_));
  if (!pw.stages.empty() && (static_cast<int>(pw.stage_of_op.size()) != ops_ || pw.routes.empty()))
    throw std::invalid_argument("workload estimator: the plan's stages do not cover model '" + g.name + "'");
  const int M = micro_batches();
  // The node of every (op, micro-batch): the replica its route picks.
  std::vector<int> node_at(static_cast<size_t>(ops_) * M, 0);
  for (int id = 0; id < ops_; ++id)
    for (int m = 0; m < M; ++m) {
      const int k = pw.node_of(id, pw.replica_of(id, m));
      if (k < 0 || k >= nodes_)
        throw std::invalid_argument("workload estimator: the plan puts graph node '" + g.nodes[id].name +
                                    "' on cluster node " + std::to_string(k) + " of " + std::to_string(nodes_));
      node_at[static_cast<size_t>(id) * M + m] = k;
    }
  auto node_of_task = [&](int op, int m) { return node_at[static_cast<size_t>(op) * M + m]; };
  const size_t K = static_cast<size_t>(nodes_);

  step_estimate est;
  est.node_compute_s.assign(K, 0.0);
  est.node_memory_bytes.assign(K, 0.0);
  std::vector<double> node_update(K, 0.0);
  // Per (op, micro-batch): the forward and backward seconds on the node its route picks.
  std::vector<double> fwd(static_cast<size_t>(ops_) * M, 0.0), bwd(fwd.size(), 0.0);
  for (int id = 0; id < ops_; ++id) {
    if (keys_[id].empty()) continue;
    std::vector<int> routed(pw.replicas(id), 0);
    for (int m = 0; m < M; ++m) {
      const int k = node_of_task(id, m);
      const size_t at = static_cast<size_t>(id) * M + m;
      fwd[at] = forward_s(id, k);
      bwd[at] = backward_s(id, k);
      est.node_compute_s[k] += fwd[at] + bwd[at];
      ++routed[pw.replica_of(id, m)];
    }
    // Every replica holds the parameters and optimizer state and updates them; activations are
    // saved for the micro-batches routed through it.
    for (int r = 0; r < pw.replicas(id); ++r) {
      const int k = pw.node_of(id, r);
      const double upd = update_s(id, k);
      node_update[k] += upd;
      est.node_compute_s[k] += upd;
      est.node_memory_bytes[k] += 4 * costs_[id].param_bytes + 2.0 * routed[r] * output_bytes(id);
    }
  }

  // The plan's bytes per (producer, consumer index, direction); a crossing the plan lacks
  // carries the graph's tensor (activation as typed, gradient as f32).
  const int n_ends = consumer_base_[ops_];
  std::vector<double> fwd_bytes(n_ends, -1.0), bwd_bytes(n_ends, -1.0);
  est.edge_s.assign(p.edges.size(), 0.0);
  // Micro-batches of a step that take each (producer, consumer index, replica pair).
  std::map<std::tuple<int, int, int, int>, int> pair_count;
  if (pw.replicated())
    for (int id = 0; id < ops_; ++id)
      for (size_t j = 0; j < g.nodes[id].consumers.size(); ++j)
        for (int m = 0; m < M; ++m)
          ++pair_count[{id, static_cast<int>(j), pw.replica_of(id, m), pw.replica_of(g.nodes[id].consumers[j].node, m)}];
  for (size_t i = 0; i < p.edges.size(); ++i) {
    const plan_edge& e = p.edges[i];
    const double bytes = static_cast<double>(wire_bytes_per_micro_batch(e));
    int uses = M;
    if (pw.replicated()) {
      auto it = pair_count.find({e.producer, e.consumer_index, e.producer_replica, e.consumer_replica});
      uses = it == pair_count.end() ? 0 : it->second;
    }
    // A data input's gradient direction is wired but never sent.
    if (bytes > 0 && e.from >= 0 && e.from < nodes_ && e.to >= 0 && e.to < nodes_)
      est.edge_s[i] = uses * transfer_s(bytes, e.from, e.to);
    if (e.producer < 0 || e.producer >= ops_ || e.consumer_index < 0 ||
        e.consumer_index >= consumer_base_[e.producer + 1] - consumer_base_[e.producer])
      continue;
    (e.forward() ? fwd_bytes : bwd_bytes)[consumer_base_[e.producer] + e.consumer_index] = bytes;
  }

  // Link state per ordered node pair, rates looked up on first use.
  std::vector<double> link_free(K * K, 0.0), link_sec_per_byte(K * K, -1.0), link_half_rtt(K * K, 0.0);
  auto prepare = [&](size_t at, int a, int b) {
    if (link_sec_per_byte[at] < 0) {
      link_sec_per_byte[at] = 8 / (link_mbit(a, b) * 1e6);
      link_half_rtt[at] = link_rtt_s(a, b) / 2;
    }
  };
  auto send = [&](int a, int b, double bytes, double t) {
    const size_t at = static_cast<size_t>(a) * K + b;
    prepare(at, a, b);
    const double start = std::max(t, link_free[at]);
    link_free[at] = start + bytes * link_sec_per_byte[at];
    return link_free[at] + link_half_rtt[at];
  };

  // Backward of one op actor runs in micro-batch order: each (op, m) waits for the previous
  // micro-batch routed through the same replica (next_same[op][m] is the one after it, or -1).
  std::vector<std::vector<int>> next_same(ops_, std::vector<int>(M, -1));
  std::vector<std::vector<char>> has_prev(ops_, std::vector<char>(M, 0));
  for (int id = 0; id < ops_; ++id) {
    std::vector<int> last(pw.replicas(id), -1);
    for (int m = 0; m < M; ++m) {
      const int r = pw.replica_of(id, m);
      if (last[r] >= 0) {
        next_same[id][last[r]] = m;
        has_prev[id][m] = 1;
      }
      last[r] = m;
    }
  }

  const size_t n_tasks = static_cast<size_t>(ops_) * M * 2;
  auto task_of = [M](int op, int m, int dir) { return (op * M + m) * 2 + dir; };
  std::vector<int> pending(n_tasks, 0);
  std::vector<double> ready_at(n_tasks, 0.0);
  std::vector<int> backward_left(ops_, 0);
  size_t expected = 0;
  for (int id = 0; id < ops_; ++id) {
    if (keys_[id].empty()) continue;
    const graph_node& n = g.nodes[id];
    // The loss turns around on its own seed gradient; every other op waits for one gradient
    // per consumer.
    const int grads = id == g.loss_node ? 0 : static_cast<int>(n.consumers.size());
    backward_left[id] = M;
    for (int m = 0; m < M; ++m) {
      pending[task_of(id, m, 0)] = static_cast<int>(n.inputs.size());
      pending[task_of(id, m, 1)] = 1 + grads + (has_prev[id][m] ? 1 : 0);
      expected += 2;
    }
  }

  min_queue<sim_event> events;
  uint64_t seq = 0;
  auto arrive = [&](int task, double t) {
    ready_at[task] = std::max(ready_at[task], t);
    if (--pending[task] == 0) events.push({ready_at[task], seq++, task, false});
  };
  // The output of `op` for micro-batch m is ready at t on its node: every consumer gets it.
  auto emit_forward = [&](int op, int m, double t) {
    const graph_node& n = g.nodes[op];
    const int from = node_of_task(op, m);
    for (size_t j = 0; j < n.consumers.size(); ++j) {
      const int w = n.consumers[j].node;
      const int to = node_of_task(w, m);
      double at = t;
      if (to != from) {
        double bytes = fwd_bytes[consumer_base_[op] + j];
        if (bytes < 0) bytes = output_bytes(op);
        at = send(from, to, bytes, t);
      }
      arrive(task_of(w, m, 0), at);
    }
  };
  // The gradient all-reduce of an op's replicas, started when its last backward is done on every
  // replica (the runtime's buckets start as soon as they are full): a ring over the stage's
  // nodes in order, 2 (R - 1) rounds of P / R bytes per link (reduce-scatter, then all-gather),
  // every link busy with 2 (R - 1) / R x P bytes; the rounds add their latency.
  double reduce_end = 0;
  auto all_reduce = [&](int op, double t) {
    const int R = pw.replicas(op);
    const double bytes = costs_[op].param_bytes;
    if (R < 2 || !(bytes > 0)) return;
    const auto& ring = pw.stages[pw.stage_of(op)].nodes;
    const double per_link = 2.0 * (R - 1) / R * bytes;
    double done = t, half_rtt = 0, slowest = 0;
    for (int r = 0; r < R; ++r) {
      const int a = ring[r], b = ring[(r + 1) % R];
      const size_t at = static_cast<size_t>(a) * K + b;
      prepare(at, a, b);
      done = std::max(done, send(a, b, per_link, t));
      half_rtt = std::max(half_rtt, link_half_rtt[at]);
      slowest = std::max(slowest, link_sec_per_byte[at]);
    }
    const double rounds = 2.0 * (R - 1);
    done += (rounds - 1) * half_rtt;
    reduce_end = std::max(reduce_end, done);
    est.allreduce_bytes += per_link * R;
    est.allreduce_s += per_link * slowest + rounds * half_rtt;
  };
  // Backward of `op` for micro-batch m is done at t: a gradient to every producer but the data.
  auto emit_backward = [&](int op, int m, double t) {
    const graph_node& n = g.nodes[op];
    const int from = node_of_task(op, m);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int u = n.inputs[i];
      if (keys_[u].empty()) continue;
      const int to = node_of_task(u, m);
      double at = t;
      if (to != from) {
        const int j = index_at_producer_[slot_base_[op] + static_cast<int>(i)];
        double bytes = j >= 0 ? bwd_bytes[consumer_base_[u] + j] : -1.0;
        if (bytes < 0) bytes = static_cast<double>(numel_of(g.nodes[u].shape)) * 4;
        at = send(from, to, bytes, t);
      }
      arrive(task_of(u, m, 1), at);
    }
    if (next_same[op][m] >= 0) arrive(task_of(op, next_same[op][m], 1), t);
    if (--backward_left[op] == 0) all_reduce(op, t);
  };

  // The coordinator feeds micro-batch m at m x the feed interval.
  est.feed_interval_s = feed_interval_s(p);
  for (int m = 0; m < M; ++m)
    for (int id = 0; id < ops_; ++id)
      if (keys_[id].empty()) emit_forward(id, m, m * est.feed_interval_s);

  std::vector<min_queue<ready_key>> ready(K);
  std::vector<char> busy(K, 0);
  std::vector<int> touched;
  double makespan = 0;
  size_t completed = 0;
  while (!events.empty()) {
    const double now = events.top().time;
    touched.clear();
    // Everything that happens at `now` first, then the idle nodes choose.
    while (!events.empty() && events.top().time <= now) {
      const sim_event ev = events.top();
      events.pop();
      const int op = ev.task / 2 / M, m = (ev.task / 2) % M, dir = ev.task % 2;
      const int k = node_of_task(op, m);
      if (ev.done) {
        busy[k] = 0;
        ++completed;
        makespan = std::max(makespan, ev.time);
        if (dir == 0) {
          emit_forward(op, m, ev.time);
          arrive(task_of(op, m, 1), ev.time);
        } else {
          emit_backward(op, m, ev.time);
        }
      } else {
        ready[k].push({ev.time, m, dir, op, ev.task});
      }
      touched.push_back(k);
    }
    for (int k : touched) {
      if (busy[k] || ready[k].empty()) continue;
      const ready_key r = ready[k].top();
      ready[k].pop();
      busy[k] = 1;
      const size_t at = static_cast<size_t>(r.op) * M + r.m;
      events.push({now + (r.dir == 0 ? fwd[at] : bwd[at]), seq++, r.task, true});
    }
  }
  if (completed != expected)
    throw std::logic_error("workload estimator: the simulated step stalled after " + std::to_string(completed) +
                           " of " + std::to_string(expected) + " tasks (a dependency that never arrives)");

  // The optimizer step waits for the last all-reduce; what of it the backward did not hide is
  // the all-reduce's share of the step.
  est.allreduce_exposed_s = std::max(0.0, reduce_end - makespan);
  est.pipeline_s = std::max(makespan, reduce_end);
  const double slowest_update = K ? *std::max_element(node_update.begin(), node_update.end()) : 0.0;
  est.optimizer_s = 3 * options_.coordinator_rtt_s + slowest_update;
  est.step_s = est.pipeline_s + est.optimizer_s;
  return est;
}

std::pair<std::vector<double>, std::vector<double>> workload_estimator::node_phase_s(const plan& p) const {
  std::vector<double> forward(nodes_, 0.0), backward(nodes_, 0.0);
  for (auto& n : graph_->nodes) {
    if (keys_[n.id].empty()) continue;
    for (int r = 0; r < p.where.replicas(n.id); ++r) {
      const int k = p.where.node_of(n.id, r);
      forward[k] += forward_s(n.id, k);
      backward[k] += backward_s(n.id, k);
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
