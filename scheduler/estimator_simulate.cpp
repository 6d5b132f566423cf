// The workload estimator's discrete-event simulation of one training step: every (op,
// micro-batch, direction) task on the node its route picks, the transfers between nodes, the
// gradient all-reduce of stage replicas, then the optimizer step. It follows the runtime's
// schedule (docs/distributed.md, actors/op_actor.cpp): the plan's pipeline schedule
// (scheduler/schedule.hpp) holds forwards or backwards back as core/live_gate.hpp does there.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "scheduler/estimator.hpp"
#include "scheduler/quota_budget.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

namespace {

// A task is (op, micro-batch, direction): index (op * M + m) * 2 + (backward ? 1 : 0).
struct sim_event {
  double time;
  uint64_t seq;   // insertion order: events at one time are handled first come, first served
  int task;
  bool done;      // completion (true) or became ready (false)
  // Written out rather than as a std::tie comparison: this runs for every heap operation of
  // every simulated step, and C++20's synthesized tuple <=> took 9% of planning time.
  bool operator>(const sim_event& o) const {
    if (o.time < time) return true;
    if (time < o.time) return false;
    return o.seq < seq;
  }
};

// What a node picks among its ready tasks: earliest ready, then micro-batch, forward before
// backward, graph order.
struct ready_key {
  double ready;
  int m, dir, op, task;
  bool operator>(const ready_key& o) const {
    if (o.ready < ready) return true;
    if (ready < o.ready) return false;
    if (m != o.m) return m > o.m;
    if (dir != o.dir) return dir > o.dir;
    return op > o.op;
  }
};

template <class T>
using min_queue = std::priority_queue<T, std::vector<T>, std::greater<T>>;

}  // namespace

// What a step's simulation needs that no quota phase changes: built once per simulate(), then
// every phase replays the event loop over it. Per (op, micro-batch) tables are flat, [op * M + m].
struct workload_estimator::step_model {
  int M = 0;
  size_t K = 0;
  std::vector<char> data_input;           // per graph node: fed by the coordinator, no op
  std::vector<int> replica_at;            // the replica of every (op, micro-batch): its route's
  std::vector<int> node_at;               // the node that replica is on
  std::vector<double> fwd, bwd;           // task seconds there, with a capped node's traffic work
  std::vector<double> fwd_bytes, bwd_bytes;  // per (producer, consumer index): bytes per micro-batch
  std::vector<double> node_update;        // per node: the optimizer's seconds
  std::vector<char> binding;              // per node: its CPU quota holds it back
  std::vector<int> next_same;             // the next micro-batch through the same replica, or -1
  std::vector<int> gate_next;             // the forward the backward of (op, m) releases, or -1
  std::vector<int> first_local;           // the first micro-batch of (op, m)'s replica
  std::vector<int> pending;               // per task: what it waits for at the start
  std::vector<int> backward_left;         // per op: backwards until its all-reduce may start
  std::vector<int> replica_base;          // per op: where its replicas start in a flat table
  std::vector<double> ring_wire;          // per op: wire bytes per gradient byte of its ring
  size_t expected = 0;                    // tasks in the step
  bool forwards_first = false;            // GPipe
  double ring_share = 1;                  // train.sync=local:H: 1 / H of a ring per step
  double feed_interval_s = 0;             // workload_estimator::feed_interval_s of the plan
  // Link rates per ordered node pair, looked up on first use (-1: not yet).
  std::vector<double> sec_per_byte, half_rtt;
  void prepare_link(const workload_estimator& e, int a, int b) {
    const size_t at = static_cast<size_t>(a) * K + b;
    if (sec_per_byte[at] >= 0) return;
    sec_per_byte[at] = 8 / (e.link_mbit(a, b) * 1e6);
    half_rtt[at] = e.link_rtt_s(a, b) / 2;
  }
};

step_estimate workload_estimator::simulate(const plan& p) const {
  step_model sm;
  step_estimate est = prepare_step(p, sm);
  bool capped = false;
  for (char b : sm.binding) capped = capped || b;
  const int phases = capped ? std::max(1, options_.quota_phases) : 1;
  run_step(p, sm, 0, phases, est);
  // Only the times depend on the phase: links, compute, memory and the ring's bytes are the
  // same in every one.
  for (int j = 1; j < phases; ++j) {
    step_estimate e;
    run_step(p, sm, j, phases, e);
    est.step_s += e.step_s;
    est.pipeline_s += e.pipeline_s;
    est.optimizer_s += e.optimizer_s;
    est.allreduce_exposed_s += e.allreduce_exposed_s;
  }
  est.step_s /= phases;
  est.pipeline_s /= phases;
  est.optimizer_s /= phases;
  est.allreduce_exposed_s /= phases;
  return est;
}

step_estimate workload_estimator::prepare_step(const plan& p, step_model& sm) const {
  const graph& g = *graph_;
  const placement& pw = p.where;
  const auto& where = pw.node_of_op;
  if (static_cast<int>(where.size()) != ops_)
    throw std::invalid_argument("workload estimator: the plan places " + std::to_string(where.size()) +
                                " graph nodes but model '" + g.name + "' has " + std::to_string(ops_));
  if (!pw.stages.empty() && (static_cast<int>(pw.stage_of_op.size()) != ops_ || pw.routes.empty()))
    throw std::invalid_argument("workload estimator: the plan's stages do not cover model '" + g.name + "'");
  const int M = micro_batches();
  const size_t K = static_cast<size_t>(nodes_);
  const size_t OM = static_cast<size_t>(ops_) * M;
  sm.M = M;
  sm.K = K;
  sm.data_input.assign(ops_, 0);
  for (int id = 0; id < ops_; ++id) sm.data_input[id] = keys_[id].empty();
  // Per graph node: micro-batches of activations one of its actors may hold (0: no bound).
  const std::vector<int> limit = live_limits(g, pw, p.schedule);
  sm.replica_base.assign(ops_ + 1, 0);
  for (int id = 0; id < ops_; ++id) sm.replica_base[id + 1] = sm.replica_base[id] + pw.replicas(id);
  // The replica of every (op, micro-batch) and the node it is on.
  std::vector<int>& replica_at = sm.replica_at;
  replica_at.assign(OM, 0);
  sm.node_at.assign(OM, 0);
  for (int id = 0; id < ops_; ++id)
    for (int m = 0; m < M; ++m) {
      const int r = pw.replica_of(id, m);
      const int k = pw.node_of(id, r);
      if (k < 0 || k >= nodes_)
        throw std::invalid_argument("workload estimator: the plan puts graph node '" + g.nodes[id].name +
                                    "' on cluster node " + std::to_string(k) + " of " + std::to_string(nodes_));
      replica_at[static_cast<size_t>(id) * M + m] = r;
      sm.node_at[static_cast<size_t>(id) * M + m] = k;
    }

  step_estimate est;
  est.node_compute_s.assign(K, 0.0);
  est.node_memory_bytes.assign(K, 0.0);
  sm.node_update.assign(K, 0.0);
  sm.fwd.assign(OM, 0.0);
  sm.bwd.assign(OM, 0.0);
  std::vector<double> replica_fwd, replica_bwd;
  std::vector<int> routed;
  for (int id = 0; id < ops_; ++id) {
    if (sm.data_input[id]) continue;
    const int R = pw.replicas(id);
    // An op runs at one pace per replica: looked up once, not per micro-batch.
    replica_fwd.assign(R, 0.0);
    replica_bwd.assign(R, 0.0);
    for (int r = 0; r < R; ++r) {
      const int k = pw.node_of(id, r);
      replica_fwd[r] = forward_s(id, k);
      replica_bwd[r] = backward_s(id, k);
    }
    routed.assign(R, 0);
    for (int m = 0; m < M; ++m) {
      const size_t at = static_cast<size_t>(id) * M + m;
      const int r = replica_at[at];
      sm.fwd[at] = replica_fwd[r];
      sm.bwd[at] = replica_bwd[r];
      est.node_compute_s[sm.node_at[at]] += sm.fwd[at] + sm.bwd[at];
      ++routed[r];
    }
    // Every replica holds the parameters and optimizer state and updates them; activations are
    // saved for the micro-batches routed through it, at most limit[id] of them at once.
    for (int r = 0; r < R; ++r) {
      const int k = pw.node_of(id, r);
      const double upd = update_s(id, k);
      sm.node_update[k] += upd;
      est.node_compute_s[k] += upd;
      const int live = limit[id] > 0 ? std::min(limit[id], routed[r]) : routed[r];
      est.node_memory_bytes[k] += 4 * costs_[id].param_bytes + live * activation_bytes(id);
    }
  }

  // The plan's bytes per (producer, consumer index, direction); a crossing the plan lacks
  // carries the graph's tensor (activation as typed, gradient as f32): filled in below.
  const int n_ends = consumer_base_[ops_];
  sm.fwd_bytes.assign(n_ends, -1.0);
  sm.bwd_bytes.assign(n_ends, -1.0);
  est.edge_s.assign(p.edges.size(), 0.0);
  // Micro-batches of a step that take each (producer, consumer index, replica pair).
  std::map<std::tuple<int, int, int, int>, int> pair_count;
  if (pw.replicated())
    for (int id = 0; id < ops_; ++id)
      for (size_t j = 0; j < g.nodes[id].consumers.size(); ++j)
        for (int m = 0; m < M; ++m)
          ++pair_count[{id, static_cast<int>(j), replica_at[static_cast<size_t>(id) * M + m],
                        replica_at[static_cast<size_t>(g.nodes[id].consumers[j].node) * M + m]}];
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
    (e.forward() ? sm.fwd_bytes : sm.bwd_bytes)[consumer_base_[e.producer] + e.consumer_index] = bytes;
  }
  for (int id = 0; id < ops_; ++id)
    for (int at = consumer_base_[id]; at < consumer_base_[id + 1]; ++at) {
      if (sm.fwd_bytes[at] < 0) sm.fwd_bytes[at] = output_bytes(id);
      if (sm.bwd_bytes[at] < 0) sm.bwd_bytes[at] = static_cast<double>(numel_of(g.nodes[id].shape)) * 4;
    }

  sm.binding.assign(K, 0);
  for (size_t k = 0; k < K; ++k)
    sm.binding[k] = quota_budget(profile_.nodes[k].quota, quota_stretch(static_cast<int>(k)) > 1, 0).binding();

  // A capped node's quota also pays for moving its tensors (serializing, encrypting, the
  // network stack: traffic_s_per_byte): the task that sends a tensor across nodes and the one
  // that receives it take that much longer there. Uncapped nodes do it on other cores.
  if (traffic_s_per_byte_ > 0)
    for (int id = 0; id < ops_; ++id) {
      if (sm.data_input[id]) continue;
      const graph_node& n = g.nodes[id];
      for (size_t j = 0; j < n.consumers.size(); ++j) {
        const int w = n.consumers[j].node;
        const double fb = sm.fwd_bytes[consumer_base_[id] + static_cast<int>(j)];
        const double bb = sm.bwd_bytes[consumer_base_[id] + static_cast<int>(j)];
        for (int m = 0; m < M; ++m) {
          const size_t u = static_cast<size_t>(id) * M + m, v = static_cast<size_t>(w) * M + m;
          const int a = sm.node_at[u], b = sm.node_at[v];
          if (a == b) continue;
          // Forward: id's task sends, w's receives; backward the other way round.
          if (sm.binding[a]) sm.fwd[u] += traffic_s_per_byte_ * fb, sm.bwd[u] += traffic_s_per_byte_ * bb;
          if (sm.binding[b]) sm.fwd[v] += traffic_s_per_byte_ * fb, sm.bwd[v] += traffic_s_per_byte_ * bb;
        }
      }
    }

  // Backward of one op actor runs in micro-batch order: each (op, m) waits for the previous
  // micro-batch routed through the same replica (next_same[op * M + m] is the one after it).
  // The live bound: the forward of an actor's k-th micro-batch waits for the backward of its
  // (k - limit)-th (gate_next: the forward released when the backward of m is done).
  // GPipe: an actor's first backward (the others follow in order) waits for all its forwards
  // (first_local: the first micro-batch of m's replica; forwards_of: its count).
  sm.forwards_first = p.schedule == pipeline_schedule::gpipe;
  sm.next_same.assign(OM, -1);
  sm.gate_next.assign(OM, -1);
  sm.first_local.assign(OM, -1);
  std::vector<char> has_prev(OM, 0), gated(OM, 0);
  std::vector<int> forwards_of(OM, -1);
  std::vector<std::vector<int>> local;
  for (int id = 0; id < ops_; ++id) {
    const size_t base = static_cast<size_t>(id) * M;
    local.assign(pw.replicas(id), {});
    for (int m = 0; m < M; ++m) local[replica_at[base + m]].push_back(m);
    for (auto& mbs : local) {
      for (size_t k = 1; k < mbs.size(); ++k) {
        sm.next_same[base + mbs[k - 1]] = mbs[k];
        has_prev[base + mbs[k]] = 1;
      }
      if (sm.data_input[id]) continue;
      for (int m : mbs) sm.first_local[base + m] = mbs.front();
      if (!mbs.empty()) forwards_of[base + mbs.front()] = static_cast<int>(mbs.size());
      if (limit[id] <= 0) continue;
      for (size_t k = static_cast<size_t>(limit[id]); k < mbs.size(); ++k) {
        sm.gate_next[base + mbs[k - limit[id]]] = mbs[k];
        gated[base + mbs[k]] = 1;
      }
    }
  }

  sm.pending.assign(OM * 2, 0);
  sm.backward_left.assign(ops_, 0);
  sm.expected = 0;
  for (int id = 0; id < ops_; ++id) {
    if (sm.data_input[id]) continue;
    const graph_node& n = g.nodes[id];
    // The loss turns around on its own seed gradient; every other op waits for one gradient
    // per consumer.
    const int grads = id == g.loss_node ? 0 : static_cast<int>(n.consumers.size());
    sm.backward_left[id] = M;
    for (int m = 0; m < M; ++m) {
      const size_t at = static_cast<size_t>(id) * M + m;
      sm.pending[at * 2] = static_cast<int>(n.inputs.size()) + (gated[at] ? 1 : 0);
      sm.pending[at * 2 + 1] = 1 + grads + (has_prev[at] ? 1 : 0) +
                               (sm.forwards_first && forwards_of[at] > 0 ? forwards_of[at] : 0);
      sm.expected += 2;
    }
  }

  // Wire bytes per gradient byte of each op's ring (its reduce edges' codec: 1 for f32, about
  // 1/2 for f16 values).
  sm.ring_wire.assign(ops_, 1.0);
  for (const plan_edge& e : p.edges)
    if (e.kind == edge_kind::reduce && e.producer >= 0 && e.producer < ops_ && e.bytes_per_micro_batch > 0)
      sm.ring_wire[e.producer] = static_cast<double>(wire_bytes_per_micro_batch(e)) / static_cast<double>(e.bytes_per_micro_batch);
  // train.sync=local:H runs the ring once every H steps: per step, 1/H of its bytes, host work
  // and rounds' latency (an amortized ring, not the one long step in H that runs it).
  sm.ring_share = 1.0 / static_cast<double>(std::max<int64_t>(1, p.allreduce_every));
  sm.sec_per_byte.assign(K * K, -1.0);
  sm.half_rtt.assign(K * K, 0.0);
  est.feed_interval_s = sm.feed_interval_s = feed_interval_s(p);
  return est;
}

void workload_estimator::run_step(const plan& p, step_model& sm, int phase, int phases, step_estimate& est) const {
  const graph& g = *graph_;
  const placement& pw = p.where;
  const int M = sm.M;
  const size_t K = sm.K;
  auto node_of_task = [&](int op, int m) { return sm.node_at[static_cast<size_t>(op) * M + m]; };

  // Per node: the CPU quota's budget (quota_budget; none on most nodes).
  std::vector<quota_budget> budget;
  budget.reserve(K);
  for (size_t k = 0; k < K; ++k) {
    // Node k's periods start (phase / phases + k / golden ratio) of a period before the step:
    // spread over the period, and apart from node to node.
    const double at = phases > 1 ? std::fmod(double(phase) / phases + double(k) * 0.6180339887498949, 1.0) : 0.0;
    budget.emplace_back(profile_.nodes[k].quota, sm.binding[k], at * profile_.nodes[k].quota.period_s);
  }

  // Link state per ordered node pair: a link is full duplex (the data channel is one TCP
  // connection per direction), so activations a -> b and gradients b -> a queue separately and
  // cross at once; each direction is one FIFO.
  std::vector<double> link_free(K * K, 0.0);
  auto send = [&](int a, int b, double bytes, double t, double latency_share = 1.0) {
    const size_t at = static_cast<size_t>(a) * K + b;
    sm.prepare_link(*this, a, b);
    const double start = std::max(t, link_free[at]);
    link_free[at] = start + bytes * sm.sec_per_byte[at];
    return link_free[at] + latency_share * sm.half_rtt[at];
  };

  const size_t n_tasks = sm.pending.size();
  auto task_of = [M](int op, int m, int dir) { return (op * M + m) * 2 + dir; };
  std::vector<int> pending = sm.pending;
  std::vector<int> backward_left = sm.backward_left;
  std::vector<double> ready_at(n_tasks, 0.0);

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
        at = send(from, to, sm.fwd_bytes[consumer_base_[op] + static_cast<int>(j)], budget[from].runnable_at(t));
      }
      arrive(task_of(w, m, 0), at);
    }
  };
  // The gradient all-reduce of an op's replicas, as the op actors run it (actors/op_actor.cpp):
  // replica r flattens its gradients when its own last backward is done, then the 2 (R - 1) ring
  // steps each send a chunk of P / R to the next replica of the stage's ring (stages[s].nodes in
  // order) on the FIFO link, message k of a replica leaving once message k - 1 reached it and was
  // added; at the end it copies the sum back. Host work is ring_s_per_byte of the node per byte
  // touched; the optimizer step waits for the last replica's sum.
  double reduce_end = 0;
  std::vector<double> replica_end(sm.replica_base.back(), 0.0);
  auto all_reduce = [&](int op) {
    const int R = pw.replicas(op);
    const double bytes = costs_[op].param_bytes * sm.ring_share;
    if (R < 2 || !(bytes > 0)) return;
    const auto& ring = pw.stages[pw.stage_of(op)].nodes;
    const double chunk = bytes / R, wire_chunk = chunk * sm.ring_wire[op];
    const int steps = 2 * (R - 1);
    std::vector<double> host(R), ready(R), into(R, 0.0), next(R);
    double half_rtt = 0, slowest = 0, slowest_host = 0;
    for (int r = 0; r < R; ++r) {
      host[r] = ring_s_per_byte(ring[r]);
      ready[r] = replica_end[sm.replica_base[op] + r] + host[r] * bytes;
      const int a = ring[r], b = ring[(r + 1) % R];
      const size_t at = static_cast<size_t>(a) * K + b;
      sm.prepare_link(*this, a, b);
      half_rtt = std::max(half_rtt, sm.half_rtt[at]);
      slowest = std::max(slowest, sm.sec_per_byte[at]);
      slowest_host = std::max(slowest_host, host[r]);
    }
    for (int k = 0; k < steps; ++k) {
      for (int r = 0; r < R; ++r) {
        // Step 0 sends the replica's own chunk; later steps add (or copy) what arrived, then send.
        const double leaves = k == 0 ? ready[r] + host[r] * chunk : std::max(ready[r], into[r]) + 2 * host[r] * chunk;
        next[(r + 1) % R] = send(ring[r], ring[(r + 1) % R], wire_chunk, leaves, sm.ring_share);
      }
      into.swap(next);
    }
    for (int r = 0; r < R; ++r)
      reduce_end = std::max(reduce_end, std::max(ready[r], into[r]) + host[r] * (chunk + bytes));
    est.allreduce_bytes += wire_chunk * steps * R;
    const double work_bytes = ring_work_bytes(bytes, R);
    for (int r = 0; r < R; ++r) est.allreduce_work_s += host[r] * work_bytes;
    est.allreduce_s += steps * (wire_chunk * slowest + half_rtt * sm.ring_share) + slowest_host * work_bytes;
  };
  // Backward of `op` for micro-batch m is done at t: a gradient to every producer but the data.
  auto emit_backward = [&](int op, int m, double t) {
    const graph_node& n = g.nodes[op];
    const int from = node_of_task(op, m);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int u = n.inputs[i];
      if (sm.data_input[u]) continue;
      const int to = node_of_task(u, m);
      double at = t;
      if (to != from) {
        const int j = index_at_producer_[slot_base_[op] + static_cast<int>(i)];
        const double bytes = j >= 0 ? sm.bwd_bytes[consumer_base_[u] + j] : static_cast<double>(numel_of(g.nodes[u].shape)) * 4;
        at = send(from, to, bytes, budget[from].runnable_at(t));
      }
      arrive(task_of(u, m, 1), at);
    }
    const size_t at = static_cast<size_t>(op) * M + m;
    if (sm.next_same[at] >= 0) arrive(task_of(op, sm.next_same[at], 1), t);
    if (sm.gate_next[at] >= 0) arrive(task_of(op, sm.gate_next[at], 0), t);
    double& replica_done = replica_end[sm.replica_base[op] + sm.replica_at[at]];
    replica_done = std::max(replica_done, t);
    if (--backward_left[op] == 0) all_reduce(op);
  };

  // The coordinator feeds micro-batch m at m x the feed interval.
  for (int m = 0; m < M; ++m)
    for (int id = 0; id < ops_; ++id)
      if (sm.data_input[id]) emit_forward(id, m, m * sm.feed_interval_s);

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
          if (sm.forwards_first) arrive(task_of(op, sm.first_local[static_cast<size_t>(op) * M + m], 1), ev.time);
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
      events.push({budget[k].run(now, r.dir == 0 ? sm.fwd[at] : sm.bwd[at]), seq++, r.task, true});
    }
  }
  if (completed != sm.expected)
    throw std::logic_error("workload estimator: the simulated step stalled after " + std::to_string(completed) +
                           " of " + std::to_string(sm.expected) + " tasks (a dependency that never arrives)");

  // The optimizer step waits for the last all-reduce; what of it the backward did not hide is
  // the all-reduce's share of the step.
  est.allreduce_exposed_s = std::max(0.0, reduce_end - makespan);
  est.pipeline_s = std::max(makespan, reduce_end);
  // Every node updates after the global-norm barrier, a capped one within what is left of its
  // budget.
  double slowest_update = 0;
  for (size_t k = 0; k < K; ++k)
    slowest_update = std::max(slowest_update, budget[k].run(est.pipeline_s, sm.node_update[k]) - est.pipeline_s);
  est.optimizer_s = 3 * options_.coordinator_rtt_s + slowest_update;
  est.step_s = est.pipeline_s + est.optimizer_s;
}

}  // namespace fusion
