// The workload estimator: what an op costs on a node, what a tensor costs on a link, how much
// memory a set of ops needs, and how long one training step of a plan takes under the runtime's
// real schedule (a discrete-event simulation of M micro-batches through the op actors). While a
// run trains, the per-op and per-edge times it measures refine the estimates (moving averages).
// Plain C++ (graph + cluster + profile in, seconds out), tested without actors.
//
// Units: seconds, bytes, Mbit/s (10^6 bit/s). Op times are per micro-batch.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

/// Settings of the estimator; the defaults describe the runtime as built.
struct estimator_options {
  /// Rate between two nodes of one site, or of two sites without a link that were not probed.
  double local_mbit = 10000;
  double local_rtt_s = 1e-4;
  /// One coordinator round trip (gradient-norm report, optimizer step, stats poll: three per step).
  double coordinator_rtt_s = 1e-3;
  /// Rates assumed for a node that stated or measured none.
  double default_gflops = 20;
  /// Memory bandwidth for ops without a measured time (op::cost bytes / this), by device kind.
  double cpu_mem_gbs = 10;
  double gpu_mem_gbs = 1500;
  /// Weight of a new measurement in the moving averages (0..1].
  double ema_weight = 0.3;
  /// Gradient bytes per second an op actor's ring work handles on one core (flattening, chunk
  /// copies, sums, unflattening: ring_work_bytes), before a node's is measured; a node's CPU
  /// share scales it. Measured 0.3-1.5 GB/s on the 2-core VM under load (docs/scheduler.md).
  double ring_host_gbs = 1;
  /// A node under a CPU quota runs in periods whose phase against the step start is unknown
  /// (and changes from step to step): the step is simulated with every capped node's periods at
  /// this many phases, spread over a period and different from node to node, and the times are
  /// their mean. Periods aligned with the step start (1) made every budget refill at once, a
  /// worst case on sites-2x3 at 20 Mbit/s (predicted 17% over the measured step).
  int quota_phases = 4;
};

/// The predicted cost of one step of a plan.
struct step_estimate {
  double step_s = 0;                    ///< wall time of one training step
  double pipeline_s = 0;                ///< forward + backward of the M micro-batches (makespan)
  double optimizer_s = 0;               ///< what follows: norm round trip, optimizer step, stats poll
  std::vector<double> node_compute_s;   ///< per cluster node: op seconds per step (fwd + bwd + update)
  std::vector<double> node_memory_bytes;///< per cluster node: memory_bytes() of its ops (a replica: activations of its micro-batches only; 1F1B: of its live bound)
  /// Per plan edge (same order as plan::edges): seconds per step on its link, all micro-batches.
  std::vector<double> edge_s;
  double feed_interval_s = 0;           ///< feed_interval_s() of the plan
  /// Stage replicas: bytes the gradient all-reduce puts on the wire per step (every ring link),
  /// the seconds it would take alone (per op: its bytes on the slowest ring link plus the
  /// rounds' latency, summed), and the seconds of it the backward does not hide (the step waits
  /// for them). 0 without replicas.
  double allreduce_bytes = 0;
  double allreduce_s = 0;
  double allreduce_exposed_s = 0;
  /// Of allreduce_s: the op actors' ring work (host copies and sums), summed over every replica.
  double allreduce_work_s = 0;
};

/// Costs of one graph on one cluster, from a profile, refined by measurements.
class workload_estimator {
 public:
  /// `profile.micro_batches` is M; `profile.nodes` must have one entry per cluster node.
  workload_estimator(const graph& g, const cluster_spec& c, cluster_profile profile, estimator_options options = {});

  const graph& model() const { return *graph_; }
  const cluster_spec& cluster() const { return *cluster_; }
  const cluster_profile& profile() const { return profile_; }
  const estimator_options& options() const { return options_; }
  int micro_batches() const { return profile_.micro_batches; }

  /// Seconds per micro-batch of graph node `id` on cluster node `node` (0 for inputs): the
  /// moving average of what was measured there, else the profile's time for its op_key scaled
  /// by that node's correction factor, else op::cost over the node's rate.
  double forward_s(int id, int node) const;
  double backward_s(int id, int node) const;
  /// Seconds of one optimizer update of the op's parameters on `node` (once per step).
  double update_s(int id, int node) const;
  /// forward_s + backward_s for every micro-batch, plus update_s: the op's seconds per step,
  /// at the node's sustained pace (times quota_stretch).
  double step_compute_s(int id, int node) const;
  /// 1 / the quota's cores on a node whose CPU quota binds (below one core: its op times are full-speed
  /// CPU times, and a node kept busy runs them at that fraction of wall time), else 1. The
  /// simulation keeps the quota's budget per period instead; the planners' balancing heuristics
  /// use this pace.
  double quota_stretch(int node) const;

  /// Mbit/s and round-trip time between two cluster nodes (measured or refined, else the cluster
  /// file's hint, else options().local_*). Infinite rate and 0 for a == b.
  double link_mbit(int a, int b) const;
  double link_rtt_s(int a, int b) const;
  /// Seconds to move one tensor of `bytes` from node a to node b: bytes / rate + rtt / 2;
  /// 0 when a == b.
  double transfer_s(double bytes, int a, int b) const;

  /// Bytes graph node `id` keeps on its node during a step: parameters, gradients and two
  /// optimizer moments (4x the parameter bytes), and activation_bytes for each of the M
  /// micro-batches.
  double memory_bytes(int id) const;

  /// Activation bytes charged to graph node `id` per micro-batch between its forward and its
  /// backward: its output's gradient, and a copy of its output for every consumer whose backward
  /// reads its inputs (op::backward_reads_inputs; an add, a fan-out node or a pooling op frees
  /// them after forward). So a residual stream's add and fan-out nodes cost the gradient alone.
  double activation_bytes(int id) const;

  /// Bytes of state that move with graph node `id` in a migration: its parameters and their two
  /// Adam moments (gradients are zero between steps; batch-norm statistics, a few floats per
  /// channel, are left out).
  double state_bytes(int id) const;

  /// Bytes of the output of graph node `id` per micro-batch (what an edge carries).
  double output_bytes(int id) const;
  /// Bytes of graph node `id`'s parameters (and of its gradient: what its all-reduce sums).
  double param_bytes(int id) const;

  /// Bytes one replica's ring work touches in the all-reduce of `param_bytes` of gradients over
  /// `replicas`: the flattening and unflattening (2 P) and, at each of the 2 (R - 1) ring steps,
  /// a chunk of P / R received (added or copied) and one sent (copied): 2 P + 4 P (R - 1) / R.
  static double ring_work_bytes(double param_bytes, int replicas);
  /// Seconds of ring work per gradient byte on `node`: measured (observe_allreduce), else
  /// 1 / ring_host_gbs scaled by the node's CPU share.
  double ring_s_per_byte(int node) const;

  /// Per cluster node, seconds per micro-batch of the forward (first) and the backward (second)
  /// of the ops `p` places there (every replica's ops on its node): the pace of each pipeline
  /// stage, phase by phase (times quota_stretch).
  std::pair<std::vector<double>, std::vector<double>> node_phase_s(const plan& p) const;

  /// The interval at which the coordinator feeds a step's micro-batches under plan `p`: the
  /// slowest node's forward seconds per micro-batch (the pipeline's steady-state rate), so that
  /// no node queues micro-batches and every node runs one micro-batch through its ops before
  /// the next (an op actor drains its whole mailbox when it runs, so micro-batches fed at once
  /// would go through a node op by op, all of them, and the next node would start only when the
  /// previous one is nearly done). 0 when one node runs every op. With stage replicas a stage
  /// takes micro-batches at the sum of its replicas' rates: the slowest stage's 1 / sum over
  /// its nodes of 1 / forward seconds; 0 when there is one stage, however replicated.
  double feed_interval_s(const plan& p) const;

  /// The predicted step time of `p` by discrete-event simulation: every op actor runs one
  /// message at a time, every node runs one op at a time (earliest ready first), forward of
  /// micro-batch m starts when all its inputs arrived (micro-batch m is fed at m x
  /// feed_interval_s), backward when all its consumers'
  /// gradients arrived (the loss turns around at once), each ordered node pair is one FIFO link
  /// that overlaps with compute, and after the last backward come three coordinator round trips
  /// and the slowest node's optimizer updates. With stage replicas every (op, micro-batch) runs
  /// on the replica its route picks, each replica's actor runs its backward in micro-batch
  /// order, and when an op's last backward is done on every replica a ring all-reduce of its
  /// gradient must finish before the optimizer step (step_estimate::allreduce_*). The ring runs
  /// as the op actors run it: replica r starts when its own last backward is done (after
  /// flattening its gradients), and each of the 2 (R - 1) ring steps sends a chunk of P / R on
  /// the FIFO link to the next replica once the previous step's chunk arrived and was added
  /// (ring_s_per_byte), so the rounds are sequential: their transfers, latencies and host work
  /// add up. Under p.schedule 1F1B the forward of an actor's k-th micro-batch also waits for its
  /// backward of the (k - live_limits)-th, and node_memory_bytes counts that many micro-batches
  /// of activations; under GPipe an actor's first backward waits for all its forwards of the step.
  /// Links are full duplex: each direction of a node pair is its own FIFO. A node whose CPU
  /// quota binds runs its tasks within the quota's budget, each task's work including
  /// traffic_s_per_byte for every byte it sends or receives across nodes; with such nodes the
  /// times are the mean over options().quota_phases phases of their periods.
  step_estimate simulate(const plan& p) const;

  /// One op's times in a step on one node, per micro-batch (the mean over the step's
  /// micro-batches).
  struct op_sample {
    int id = -1;
    double forward_s = 0;
    double backward_s = 0;
  };
  /// Refinement from one step's measurements of the ops on `node`: each op's moving average, and
  /// the node's correction factor (measured / profile), so that its unmeasured ops follow. The
  /// factor moves once per call, towards the ops' measured seconds summed over their profiled
  /// seconds summed: a time-weighted ratio. A node slowed by stops (a duty cycle, a co-tenant)
  /// stretches its long ops the most while its shortest ones often run between two stops at
  /// full speed; a factor moved op by op would end near whatever the last few ops showed.
  void observe_ops(int node, const std::vector<op_sample>& ops);
  /// observe_ops with one op.
  void observe_op(int id, int node, double forward_s, double backward_s);
  /// One tensor of `bytes` took `seconds` from a to b, as an edge sender times it: from its first
  /// chunk sent (a round trip more than the link was busy: the data's way there and the last
  /// acknowledgement's way back) or, queued behind another tensor, from that one's last
  /// acknowledgement (the link's busy time alone), to its own last acknowledgement.
  /// `round_trips` says which (1 or 0; for a mean over several tensors, the share timed from
  /// their first chunk). Refines the pair's rate, keeping its round-trip time.
  void observe_transfer(int a, int b, double bytes, double seconds, double round_trips);
  /// A replica on `node` spent `work_s` on ring work that touched `work_bytes`
  /// (ring_work_bytes): refines the node's ring_s_per_byte.
  void observe_allreduce(int node, double work_bytes, double work_s);

  /// On nodes whose CPU quota binds, the seconds their processes spent outside the ops, the
  /// optimizer and the ring (`host_s`: messages, serialization, encryption, the network stack,
  /// which the quota pays for too) while their cross-node edges carried `bytes` (sent plus
  /// received) in one step: refines traffic_s_per_byte.
  void observe_host_traffic(double host_s, double bytes);
  /// CPU seconds a capped node spends per byte it sends or receives across nodes (0 until
  /// measured): the simulation adds it to the work of the task that sends or receives the
  /// tensor, within the node's quota budget.
  double traffic_s_per_byte() const { return traffic_s_per_byte_; }

  /// A node that joins the running job (or comes back): its profile `np` replaces the one it
  /// had, `links` (measured when it joined; others' site pairs stay) replace those site pairs,
  /// and whatever was measured on the node before is forgotten. Other nodes' measurements stay.
  /// Until it runs ops its profile is taken as it is (timed under the run's load), not scaled by
  /// the other nodes' correction.
  void admit_node(int node, const node_profile& np, const std::vector<link_profile>& links);

  /// The CPU quota `node` runs under now (read by its process at each step's poll), when it
  /// differs from its profile's: a quota changed while the run trains (a cgroup throttled, a
  /// co-tenant's share given back). Under a binding quota the node's op times are CPU times, which
  /// a lower quota leaves as they were; only the quota's budget per period shows the slowdown, so
  /// the estimator must be told. Returns whether it changed anything (GPU nodes: never; a quota
  /// of a core or more counts as none).
  bool set_quota(int node, const cpu_quota& quota);

  /// This estimator seen on a part of its cluster: `sub` holds the nodes full[0], full[1], ...
  /// of cluster() (in that order, sites and links unchanged) and must outlive the result, which
  /// keeps every refinement (measured op times, corrections, links, ring work) of those nodes.
  workload_estimator restricted(const cluster_spec& sub, const std::vector<int>& full) const;

 private:
  // simulate() in two parts: what no quota phase changes (compute, memory and link times, the
  // tables of the event loop), built once; then the event loop with capped nodes' quota periods
  // at phase `phase` of `phases` (0 of 1: aligned with the step start), which sets the times of
  // `est` and adds the ring's bytes and work to it.
  struct step_model;
  step_estimate prepare_step(const plan& p, step_model& sm) const;
  void run_step(const plan& p, step_model& sm, int phase, int phases, step_estimate& est) const;
  void set_node_rates(int node);   // base_fwd_/bwd_/upd_ of one node from profile_
  void set_link_rates();           // base_mbit_/rtt_ from profile_
  double profile_forward_s(int id, int node) const;
  double profile_backward_s(int id, int node) const;
  /// correction_[node] once measured; else 1 for a node admitted mid-run, else the mean of the
  /// measured nodes of its device kind.
  double correction_of(int node) const;
  void refresh_corrections();      // node_correction_ from correction_ and correction_seen_

  const graph* graph_;
  const cluster_spec* cluster_;
  cluster_profile profile_;
  estimator_options options_;
  std::vector<std::string> keys_;                      // op_key per graph node ("" for inputs)
  std::map<std::pair<int, int>, std::pair<double, double>> measured_;  // (id, node) -> (fwd, bwd)
  std::vector<double> correction_;                     // per node: measured / profile (1 until measured)
  std::vector<char> correction_seen_;                  // per node: measured at least once
  std::vector<char> profiled_in_run_;                  // per node: admitted mid-run, profiled under its load
  std::vector<double> node_correction_;                // per node: what correction_of returns
  std::map<std::pair<int, int>, double> link_mbit_;    // (min node, max node) -> refined rate
  std::vector<double> ring_s_per_byte_;                // per node: measured ring work, -1 until measured
  double traffic_s_per_byte_ = 0;                      // capped nodes' host CPU per cross-node byte
  bool traffic_seen_ = false;

  // Precomputed in the constructor so the per-op functions stay O(log n) under the OP-Fence DP.
  int ops_ = 0, nodes_ = 0;                            // graph nodes, cluster nodes
  std::vector<op_cost> costs_;                         // op::cost per graph node (zero for inputs)
  std::vector<double> kept_copies_;                    // per graph node: consumers that keep its output
  std::vector<double> base_fwd_, base_bwd_, base_upd_; // [node * ops_ + id]: profile or cost, uncorrected
  std::vector<double> base_mbit_, base_rtt_;           // [a * nodes_ + b]: profile or options, unrefined
  std::vector<int> consumer_base_;                     // per graph node: offset of its consumers in a flat list
  std::vector<int> slot_base_;                         // per graph node: offset of its input slots in a flat list
  std::vector<int> index_at_producer_;                 // per (node, slot): its position in the producer's consumers
};

}  // namespace fusion
