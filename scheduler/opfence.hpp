// OP-Fence: placement from measured devices and links (docs/scheduler.md says what we chose and
// why). Three steps:
//   fences  nodes joined by links that are fast relative to the rest (single linkage on
//           log-bandwidth, split at the widest gap when it is at least a factor gap_factor);
//   order   candidate pipeline chains of fences and of nodes inside each that keep the slowest
//           links off the chain (a slow link that must be crossed is crossed once);
//   cut     an exact dynamic program over cut points of the topologically ordered DAG that
//           minimises the bottleneck: max over stages of compute seconds per step and over cuts
//           of transfer seconds per step, every edge crossing a cut counted (a cut just before
//           an op's fan-out node carries its tensor once, just after it once per reader, and the
//           DP sees both), subject to each node's memory.
// Every candidate chain's cut (and, as further candidates, the DP's cut using every node and an
// equal-FLOPs cut along the chain) is simulated by the workload estimator; the fastest wins, and
// the simulator then moves its cuts a few ops either way while that is faster (the DP's
// bottleneck does not see pipeline fill and drain).
// Plain C++, tested without actors.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "scheduler/estimator.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

/// Settings of OP-Fence.
struct opfence_options {
  /// Two groups of nodes form separate fences when the fastest link between them is at least
  /// this factor slower than the slowest link inside either (single linkage on log-bandwidth).
  double gap_factor = 4.0;
  /// Nodes may be left without ops (a node behind a very slow link) for chains up to this
  /// length; longer chains use every node (keeps planning O(K n^2)).
  int skip_nodes_up_to = 16;
  /// At most this many candidate chains are cut and simulated.
  int max_candidates = 24;
  /// Refinement of the best candidate by the simulator: each cut may move by up to this many
  /// ops either way (0: off), within at most refine_simulations simulations.
  int refine_shift = 3;
  int refine_simulations = 300;
  /// Applied to every candidate plan before it is simulated, e.g. the codecs a compressed run
  /// would give its edges (scheduler/compression_plan.hpp), so that a slow link that compression
  /// makes cheap can carry a stage boundary. Empty: plans are simulated as wired (dense).
  std::function<void(plan&)> prepare_plan;
  /// The schedule the run takes (train.schedule, or the running one for a re-plan): every
  /// candidate is simulated under it. Empty: train.schedule=auto, each candidate under its
  /// fastest schedule (simulate_fastest_schedule), as the run will choose.
  std::optional<pipeline_schedule> schedule;
  /// The compression-aware DP: the fraction of its dense bytes a stage boundary carries under
  /// the run's codec (scheduler/compression_plan.hpp: the codec's wire bytes per fp32 byte, or
  /// AdaTopK's most compressed rung its floors allow). Below 1, every chain's cuts are also
  /// solved with link costs scaled by it, as further candidates for the simulator: a slow link
  /// that compression makes cheap may then carry a boundary the dense DP would avoid (or drop
  /// the far node for). 1: dense only.
  double cut_bytes_ratio = 1.0;
  /// The fraction of the fp32 gradient bytes a ring hop of the replicas' all-reduce carries
  /// (train.allreduce f16: scheduler/compression_plan.hpp's allreduce_bytes_ratio); the group
  /// DP prices the ring with it, as the simulator does through the reduce edges' codec.
  double allreduce_bytes_ratio = 1.0;
  /// Steps per all-reduce (train.sync: 1 for step, H for local:H): the group DP prices the
  /// ring's bytes and time per step at 1/H, as the simulator does (plan::allreduce_every).
  int64_t allreduce_every = 1;
  /// Stage replicas (scheduler/opfence_replicas.cpp): also try chains of node groups, each group
  /// holding one stage with one replica per node, and keep the fastest plan; the pipeline-only
  /// plan stays when nothing beats it (policy "opfence-replicas"). Off: pipeline only (policy "opfence").
  bool replicas = false;
  /// Candidate chains tried with replica groups (the best first of candidate_chains).
  int replica_chains = 4;
  /// Group widths tried: a chain is cut into groups of this many consecutive nodes.
  std::vector<int> replica_widths = {2, 3, 4, 6, 8, 12, 16, 24, 32, 48};
};

/// The cut problem on one chain, as plain numbers (what the dynamic program and the brute force
/// of the tests both solve). Ops are the graph's compute ops in topological order, 0..n-1; chain
/// positions 0..K-1.
struct cut_problem {
  /// compute_s[k][i]: seconds per step of op i on the node at chain position k.
  std::vector<std::vector<double>> compute_s;
  /// cross_bytes[i] for i in 1..n-1: bytes per step crossing a cut placed just before op i (one
  /// direction; every edge u -> w with u < i <= w counted once per such edge). cross_bytes[0]
  /// is unused (0).
  std::vector<double> cross_bytes;
  /// seconds_per_byte[k][k2] and latency_s[k][k2]: the link from chain position k to k2 > k
  /// (make_cut_problem: latency_s is the pair's round trip, paid once per step: half with the
  /// forward crossing, half with the backward one; the link pipelines the micro-batches).
  std::vector<std::vector<double>> seconds_per_byte;
  std::vector<std::vector<double>> latency_s;
  /// memory_bytes[i]: bytes op i needs; capacity_bytes[k]: what node k has (0: no limit).
  std::vector<double> memory_bytes;
  std::vector<double> capacity_bytes;
  /// Optional (empty: none), for positions that are groups of replicas: reduce_s[k][i], the
  /// seconds per step of op i's gradient all-reduce on position k. A stage then costs the larger
  /// of its compute and its all-reduce (they overlap: the ring runs while the backward goes on).
  std::vector<std::vector<double>> reduce_s;
  /// Optional (empty: memory_bytes everywhere): memory_at[k][i], the bytes op i needs on
  /// position k (a replica saves activations only for the micro-batches routed through it).
  std::vector<std::vector<double>> memory_at;
  /// Whether chain positions may get no ops (the chain then continues past them). Without it
  /// every position gets at least one op, the first op goes to position 0 and the last to K-1;
  /// with fewer ops than positions the problem is solved as if it were allowed.
  bool allow_skip = true;
};

/// A solution: the chain position of every op (non-decreasing), its bottleneck and the sum of
/// its stage and cut costs (the tie-break: among equal bottlenecks, the least total work).
struct cut_solution {
  bool feasible = false;
  std::vector<int> position_of_op;
  double bottleneck = 0;
  double total = 0;
};

/// The exact optimum of `p` (lexicographic: bottleneck, then total) by dynamic programming over
/// (ops placed, last chain position used).
cut_solution solve_cuts(const cut_problem& p);

/// The same by enumerating every assignment (tests only: exponential).
cut_solution brute_force_cuts(const cut_problem& p);

/// The cost of one assignment under `p` (bottleneck and total), or infeasible (memory, order).
cut_solution evaluate_cuts(const cut_problem& p, const std::vector<int>& position_of_op);

/// `p` with every link's seconds per byte scaled by `ratio` in (0, 1] (what a codec that sends
/// that fraction of the dense bytes makes of them); the compression-aware DP solves it.
cut_problem compress_links(cut_problem p, double ratio);

/// The compute ops (not inputs) of `g`, in graph (topological) order: the positions a chain's
/// cuts fall between.
std::vector<int> compute_ops(const graph& g);

/// Fences: groups of cluster node indices, each sorted; nodes of one site are always in one
/// fence. Rates come from est.link_mbit.
std::vector<std::vector<int>> make_fences(const workload_estimator& est, double gap_factor);

/// Candidate chains (cluster node indices, each node once) built from `fences`: fence orders
/// that maximise the slowest link between consecutive fences (all orders for up to 6 fences,
/// greedy from each start beyond), nodes inside a fence by the same rule, each chain also
/// reversed; at most `max_candidates`, best first.
std::vector<std::vector<int>> candidate_chains(const workload_estimator& est, const std::vector<std::vector<int>>& fences,
                                               int max_candidates);

/// The cut problem of `chain` for the estimator's graph.
cut_problem make_cut_problem(const workload_estimator& est, const std::vector<int>& chain, bool allow_skip);

/// What OP-Fence decided and why (fusion-cluster plan prints it).
struct opfence_report {
  std::vector<std::vector<int>> fences;
  std::vector<int> chain;               ///< the chosen chain
  double bottleneck_s = 0;              ///< the DP's bottleneck on it
  step_estimate estimate;               ///< the simulated step of the chosen plan
  int candidates = 0;                   ///< plans simulated (up to three cuts per candidate chain)
  int refined_moves = 0;                ///< cut moves the refinement kept
  double dp_step_s = 0;                 ///< the simulated step of the DP's cut before refinement
  /// With replicas (opfence_options::replicas): the simulated step of the best pipeline-only
  /// plan, how many replica plans were simulated, and whether one of them won (then `chain`
  /// is the first node of every group and `groups` the groups of the chosen chain).
  double pipeline_step_s = 0;
  int replica_candidates = 0;
  bool replicated = false;
  std::vector<std::vector<int>> groups;
};

/// A candidate placement's predicted step, as OP-Fence judges it: wired into a plan, with
/// options.prepare_plan applied (the run's codecs), under the schedule its run would take
/// (options.schedule, or else its fastest: simulate_schedule, scheduler/schedule.hpp).
step_estimate simulate_candidate(const workload_estimator& est, const opfence_options& options, const placement& p);

/// The candidates one planning call has simulated, by placement. OP-Fence's chains, their
/// halves, the DP's variants, the equal-FLOPs cuts, the refinement and the replica search reach
/// the same placement again and again (13-50% of the simulations on the shipped topologies), and
/// each simulation is an event loop per schedule and quota phase. Valid for one estimator state
/// and one set of options: one planning call.
class candidate_cache {
 public:
  /// simulate_candidate(est, options, p), simulated the first time an equal placement is asked.
  step_estimate simulate(const workload_estimator& est, const opfence_options& options, const placement& p);
  /// Requests answered without a simulation.
  int hits() const { return hits_; }

 private:
  using key = std::tuple<std::vector<int>, std::vector<int>, std::vector<std::vector<int>>,
                         std::vector<std::vector<double>>, std::vector<std::vector<int>>>;
  std::map<key, step_estimate> done_;
  int hits_ = 0;
};

/// Places the estimator's graph with pipeline-only OP-Fence (one node per op). Throws
/// placement_error (naming the cluster file) when no chain fits in memory: the message names the
/// node with the most memory, what it has and what the smallest stage needs.
placement opfence_pipeline_place(const workload_estimator& est, const opfence_options& options = {},
                                 opfence_report* report = nullptr);
/// The same, judging candidates through `cache` (opfence_place shares one with its replica search).
placement opfence_pipeline_place(const workload_estimator& est, const opfence_options& options, opfence_report* report,
                                 candidate_cache& cache);

/// OP-Fence: opfence_pipeline_place, then with options.replicas the chains of replica groups
/// (scheduler/opfence_replicas.cpp); the fastest simulated plan wins, the pipeline-only one on
/// ties, so the result is never predicted slower than pipeline-only. Deterministic.
placement opfence_place(const workload_estimator& est, const opfence_options& options = {}, opfence_report* report = nullptr);

/// The groups of `chain` for replica width `width`: consecutive chain nodes, at most `width` per
/// group, a new group at every fence boundary unless `span_fences`.
std::vector<std::vector<int>> replica_groups(const std::vector<int>& chain, const std::vector<std::vector<int>>& fences,
                                             int width, bool span_fences);

/// The cut problem over a chain of replica groups: a group's compute per op is M micro-batches
/// at the sum of its nodes' rates plus the slowest node's update, its all-reduce (reduce_s) the
/// op's gradient bytes x 2 (R - 1) / R over the slowest ring link plus the rounds' latency; a cut
/// between groups uses their slowest node pair, shared by min(R, R') parallel routes; memory
/// counts the activations of the micro-batches a replica takes (M / R, rounded up) against the
/// smallest member.
/// `ring_bytes_ratio`: the fraction of the fp32 gradient bytes a ring hop carries (an f16
/// all-reduce: opfence_options::allreduce_bytes_ratio); `ring_every`: steps per all-reduce
/// (train.sync=local:H), each op's reduce_s is divided by it.
cut_problem make_group_cut_problem(const workload_estimator& est, const std::vector<std::vector<int>>& groups,
                                   bool allow_skip, double ring_bytes_ratio = 1.0, int64_t ring_every = 1);

/// The placer registered for placement_policy::opfence (options.replicas off) and
/// placement_policy::opfence_replicas (on): builds a workload_estimator from (g, c, profile)
/// and calls opfence_place.
class opfence_placer : public placer {
 public:
  explicit opfence_placer(opfence_options options = {}) : options_(options) {}
  const char* name() const override { return options_.replicas ? "opfence-replicas" : "opfence"; }
  placement place(const graph& g, const cluster_spec& c, const cluster_profile& profile) const override;

 private:
  opfence_options options_;
};

}  // namespace fusion
