// Operator placement: which cluster node runs each node of the OP-DAG. One interface (placer),
// one implementation per placement_policy; place_ops dispatches on the cluster file's policy.
// Plain C++ (graph + cluster + profile in, placement out), tested without actors.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/result.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

/// A placement error; what() reads "FILE:LINE: message" naming the cluster file (the assign
/// entry or the placement section), or "FILE: message" when no line applies.
struct placement_error : error {
  using error::error;
};

/// The nodes that hold one stage. A stage is the set of ops that share one replica set; each of
/// its R >= 1 replicas holds its own op actors for every op of the stage (identical initial
/// weights), and every micro-batch goes through exactly one of them (plan routes).
struct stage_replicas {
  /// Replica r of the stage runs on cluster node nodes[r]. nodes[0] is the node_of_op of the
  /// stage's ops. No node appears twice, nor in two stages. The ring of the gradient all-reduce
  /// follows this order (nodes[r] sends to nodes[(r + 1) % R]).
  std::vector<int> nodes;
  /// Per replica: its relative speed (> 0, same size as nodes); micro-batches are dealt in
  /// proportion (deal_routes).
  std::vector<double> weights;
};

/// Where every graph node runs: one node per op (pipeline only), or several replicas per stage.
///
/// Pipeline only (`stages` empty): node_of_op is everything, as before replicas existed.
/// Replicated: `stages` lists every stage (R = 1 ones too) in order of their first graph node,
/// `stage_of_op` names each graph node's stage (inputs join the stage of their node), and
/// `routes` deals the micro-batches of a step over the replicas. Everything that reads only
/// node_of_op sees replica 0 of every op.
struct placement {
  placement() = default;
  /// A pipeline placement: `nodes` is node_of_op.
  placement(std::vector<int> nodes) : node_of_op(std::move(nodes)) {}

  /// For every graph node id (inputs included): index into cluster_spec::nodes of replica 0.
  std::vector<int> node_of_op;
  /// Every stage and its replicas; empty when every op has one replica and no routes.
  std::vector<stage_replicas> stages;
  /// Per graph node (when stages is not empty): index into stages.
  std::vector<int> stage_of_op;
  /// routes[m][s]: the replica of stage s that micro-batch m of every step goes through; one
  /// row per micro-batch of a step (M rows), dealt by deal_routes. Empty: replica 0 everywhere.
  std::vector<std::vector<int>> routes;

  /// Whether any stage has more than one replica.
  bool replicated() const;
  /// Replicas of graph node `op` (1 without stages).
  int replicas(int op) const;
  /// The cluster node of replica `replica` of graph node `op`.
  int node_of(int op, int replica) const;
  /// The replica of graph node `op` that micro-batch `m` goes through (row m % routes.size()).
  int replica_of(int op, int m) const;
  /// The stage of graph node `op` (-1 without stages).
  int stage_of(int op) const { return stages.empty() ? -1 : stage_of_op.at(op); }
};

/// Routes of `micro_batches` micro-batches over `stages` (scheduler/replicas.cpp): per stage, the
/// replicas get micro-batch counts in proportion to their weights (largest remainder, ties to
/// the lower replica), spread over the step by smooth weighted round robin (each micro-batch goes
/// to the replica furthest behind its share, ties to the lower replica), so replica r of a stage
/// gets micro-batches evenly spaced through the step. Deterministic: the same stages and count
/// give the same routes. Throws std::invalid_argument for a stage without nodes or with a weight
/// that is not positive and finite.
std::vector<std::vector<int>> deal_routes(const std::vector<stage_replicas>& stages, int micro_batches);

/// How many of the micro-batches of a step go through each replica of stage `stage`.
std::vector<int> routed_micro_batches(const placement& p, int stage);

/// `pipeline` (node_of_op only) with replicas: every op on stages[s].nodes[0] joins stage s, and
/// every other node that holds ops becomes a stage of one replica (weight 1). Stages are ordered
/// by their first graph node, routes dealt for `micro_batches`. Throws std::invalid_argument when
/// a stage has no nodes, names a node twice, shares a node with another stage or with ops placed
/// elsewhere, or its first node holds no op.
placement replicate(placement pipeline, std::vector<stage_replicas> stages, int micro_batches);

/// Whether `a` and `b` (placements of one graph) put every replica of every op on the same node
/// and deal every micro-batch to the same replicas: whether a change of placement changes anything.
bool same_placement(const placement& a, const placement& b);

/// Graph node ids (inputs included, ascending) whose nodes, replica by replica, differ between
/// `from` and `to`: what a change of placement moves, adds or drops.
std::vector<int> changed_ops(const placement& from, const placement& to);

/// The (graph node id, replica) pairs of `to` whose node holds no replica of that op under
/// `from`: the op actors a change of placement spawns and fills with the op's state (taken from
/// replica 0 under `from`; replicas are identical between steps). Ops in graph order, replicas
/// ascending; for pipeline placements, the ops that move.
std::vector<std::pair<int, int>> arriving_replicas(const placement& from, const placement& to);

/// `p` with the ops `ops` (graph node ids) on cluster node `node`: their replica 0 moves there.
/// With stage replicas, the moved ops join the stage whose first node is `node` (and so its
/// replicas), or else a stage of one replica there; a replicated stage whose first node keeps no
/// op ends (its replicas with it); routes are dealt again for `micro_batches`. Throws
/// std::invalid_argument in plain words (names from `g` and `c`) when `node` holds a later replica
/// of a stage.
placement move_ops(const graph& g, const cluster_spec& c, placement p, const std::vector<int>& ops, int node,
                   int micro_batches);

/// `p` with the stage of graph node `op` held by `nodes` (cluster node indices): nodes[0] holds
/// the stage's ops (they move there when it is another node), every further node a replica. The
/// stage's replicas get equal weights (micro-batches dealt evenly), the other stages keep theirs;
/// routes are dealt again for `micro_batches`. A pipeline placement's stage of `op` is every op on
/// its node. Throws std::invalid_argument in plain words when `nodes` is empty, names a node twice,
/// or names a node that holds ops or replicas of another stage.
placement set_stage_replicas(const graph& g, const cluster_spec& c, placement p, int op, const std::vector<int>& nodes,
                             int micro_batches);

/// The replicated stages of `p` for people: "ops h0.ln1 .. h0.res2 on nodes a1, a2, a3; ops ...
/// on nodes b1, b2", one entry per stage of more than one replica; empty for a pipeline.
std::string format_replicated_stages(const graph& g, const cluster_spec& c, const placement& p);

/// One placement policy. A later policy (OP-Fence) derives from this and is returned by
/// make_placer for its placement_policy value.
class placer {
 public:
  virtual ~placer() = default;
  /// The policy name as written in cluster files.
  virtual const char* name() const = 0;
  /// Places every node of `g` on a node of `c`, knowing what `profile` says about its nodes and
  /// links (measured rates, devices); throws placement_error when it cannot.
  virtual placement place(const graph& g, const cluster_spec& c, const cluster_profile& profile) const = 0;
};

/// The placer of `policy`.
std::unique_ptr<placer> make_placer(placement_policy policy);

/// Places `g` on `c` with the cluster file's policy:
/// make_placer(c.placement.policy)->place(g, c, profile).
placement place_ops(const graph& g, const cluster_spec& c, const cluster_profile& profile);

/// place_ops(g, c, profile_from_cluster(c)): the placement before anything is measured.
placement place_ops(const graph& g, const cluster_spec& c);

/// Places every input (data) node of `g` that is not `fixed` on the node of its first consumer in
/// graph order; the other entries of `p.node_of_op` must already be set. `fixed` has one entry
/// per graph node.
void place_inputs(const graph& g, placement& p, const std::vector<bool>& fixed);

/// Puts every fan-out node of `g` (graph_node::fanout: the identity the loader puts between an op
/// and its several consumers) with its consumers when they all sit on one node (one stage, with
/// replicas): the tensor then crosses to them once, and their gradients come back summed, instead
/// of once per consumer. Others stay where they are, as does one that is the only op of its node
/// (stage), which would otherwise idle. Every policy's placement and every plan
/// (make_plan) goes through it; applying it twice changes nothing.
placement place_fanouts(const graph& g, placement p);

/// Estimated FLOPs of one training step (forward + backward) of every graph node, by id, from
/// op::cost for the batch size the graph was loaded with; 0 for inputs.
std::vector<double> op_flops(const graph& g);

/// Whether `name` matches `pattern` as fnmatch(3) without flags: '*' matches any run of
/// characters (dots included), '?' exactly one, '[...]' one of a set ("h[0-2].fc"), a
/// backslash makes the next character literal, everything else matches itself.
bool glob_match(const std::string& pattern, const std::string& name);

/// Stage boundaries that split `costs` into `parts` contiguous non-empty runs minimising the
/// most expensive run (ties: the smallest sum of squared run costs). Returns parts + 1 offsets,
/// first 0 and last costs.size(); requires 1 <= parts <= costs.size().
std::vector<size_t> balanced_cuts(const std::vector<double>& costs, size_t parts);

/// Graph node ids (ascending) as names, runs of consecutive ids written "first .. last":
/// "wte .. h1.res2, lm_head".
std::string format_op_runs(const graph& g, const std::vector<int>& ops);

/// A byte count for people: "512 B", "64.0 KiB", "1.5 MiB".
std::string human_bytes(double bytes);

/// "2.31 s", "40.2 ms" or "850 us".
std::string seconds_text(double s);

/// One row of a placement table.
struct placement_row {
  int node = -1;                    ///< index into cluster_spec::nodes
  std::vector<int> ops;             ///< graph node ids on it, in graph order, inputs included
  int compute_ops = 0;              ///< ops that are not inputs
  double flops = 0;                 ///< estimated FLOPs per step on it
  double share = 0;                 ///< flops / total flops (0..1)
  int stage = -1;                   ///< with replicas: its stage (-1: idle or no replicas)
  int replica = 0;                  ///< with replicas: which replica of the stage it holds
  int replicas = 1;                 ///< with replicas: how many the stage has
  int micro_batches = 0;            ///< with replicas: micro-batches of a step routed through it
};

/// Per cluster node (file order): its ops and estimated FLOPs share (with replicas: the share of
/// the micro-batches routed through it).
std::vector<placement_row> describe_placement(const graph& g, const cluster_spec& c, const placement& p);

/// A printable table: one line per node with site, device, op count, FLOPs share and the ops
/// (contiguous runs written "first .. last"), then the cross-node edges with their link rate.
std::string format_placement(const graph& g, const cluster_spec& c, const placement& p);

}  // namespace fusion
