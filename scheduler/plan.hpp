// The plan of a run: where every operator runs (placement) and how the graph is wired across
// nodes (one plan_edge per direction of every graph edge whose ends sit on different nodes).
// The coordinator executes plans; migration, recovery and compression changes are all "make a
// new plan, diff it against the current one, apply the diff at a step boundary".
// Plain C++ (graph + cluster + profile in, plan out), tested without actors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compression/codec.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

/// How one direction of a cross-node edge is carried: its codec (compression/codec.hpp).
using edge_setting = codec_settings;

/// What a plan edge carries: activations (producer -> consumer), their gradients (consumer ->
/// producer), or one hop of an op's gradient all-reduce ring between two of its replicas.
enum class edge_kind : uint8_t { forward = 0, backward = 1, reduce = 2 };

/// "fwd", "bwd" or "reduce".
const char* edge_kind_name(edge_kind k);

/// One direction of a graph edge whose producer and consumer run on different nodes. With stage
/// replicas, one per pair (producer replica, consumer replica) that some route puts on
/// different nodes; pipeline-only plans have replica 0 at both ends.
///
/// A reduce edge is one hop of the gradient ring of an op with parameters and R > 1 replicas:
/// producer == consumer == the op, producer_replica r sends to consumer_replica (r + 1) % R,
/// consumer_index and slot are -1.
struct plan_edge {
  uint64_t id = 0;              ///< unique within a run; never reused by a later plan
  edge_kind kind = edge_kind::forward;
  int producer = -1;            ///< graph node id of the op whose output the edge carries
  int consumer = -1;            ///< graph node id of the op reading it
  int slot = -1;                ///< the consumer's input slot
  int consumer_index = -1;      ///< position of (consumer, slot) in the producer's consumers
  int producer_replica = 0;     ///< replica of the producer op (placement::node_of(producer, r) == from or to)
  int consumer_replica = 0;     ///< replica of the consumer op
  int from = -1, to = -1;       ///< cluster node indices: sender and receiver of this direction
  /// Tensor bytes per micro-batch in this direction. A reduce edge carries its ring hop once per
  /// step, not per micro-batch: the op's parameter bytes x 2 (R - 1) / R (reduce-scatter then
  /// all-gather, each R - 1 chunks of 1/R of the gradients).
  uint64_t bytes_per_micro_batch = 0;
  bool compressible = false;    ///< carries f32 tensors (codecs apply; token ids never compress)
  edge_setting setting;
  /// Whether it carries activations (forward) rather than gradients or a ring hop.
  bool forward() const { return kind == edge_kind::forward; }
};

/// Bytes one micro-batch of `e` puts on the wire with its codec (codec::wire_bytes): the
/// payload when the codec encodes it, else bytes_per_micro_batch. A reduce edge's codec (f16
/// with train.allreduce=f16) counts although the edge is not `compressible`.
uint64_t wire_bytes_per_micro_batch(const plan_edge& e);

/// "none", "adatopk dense" (ratio 1: raw bytes), or "topk 10% f16", "adatopk 20% f16" (+ " ef"
/// with error feedback).
std::string codec_text(const edge_setting& s);

/// Placement plus wiring.
///
/// With stage replicas (where.stages not empty) the runtime holds one op actor per (op, replica)
/// on where.node_of(op, replica); micro-batch m goes through replica where.replica_of(op, m) of
/// every op. An edge exists for every graph edge u -> w and every pair (replica_of(u, m),
/// replica_of(w, m)) over the step's micro-batches whose nodes differ; pairs on one node (the ops
/// of one replica of a stage) talk directly, as ops of one node always did.
struct plan {
  placement where;              ///< node of every graph node (inputs included), replicas and routes
  /// The data edges ordered by (producer, consumer_index, producer_replica, consumer_replica,
  /// forward before backward), then the reduce edges by (op, sending replica); without replicas
  /// exactly the pipeline plan's edges and ids.
  std::vector<plan_edge> edges;
  uint64_t next_edge_id = 1;    ///< the id a later plan of this run starts from
  /// How the stages interleave forwards and backwards (scheduler/schedule.hpp); the op actors
  /// get its live bound with their wiring, and the estimator simulates it.
  pipeline_schedule schedule = pipeline_schedule::eager;
  /// Steps per all-reduce of the replicas (train.sync: 1 for step, H for local:H, set by
  /// assign_codecs): the estimator counts 1/H of the ring's bytes and time per step.
  int64_t allreduce_every = 1;

  /// The edge with this id, or null.
  const plan_edge* find(uint64_t id) const;
  /// The edge carrying direction `forward` of the graph edge producer -> its consumer number
  /// `consumer_index`, or null when both ends share a node.
  const plan_edge* find(int producer, int consumer_index, bool forward) const;
  /// The same between replica `producer_replica` of the producer and `consumer_replica` of the
  /// consumer, or null when both sit on one node or no route joins them.
  const plan_edge* find(int producer, int consumer_index, bool forward, int producer_replica, int consumer_replica) const;
  /// The reduce edge from replica `replica` of `op` to its ring successor, or null (no
  /// parameters, one replica, or both on one node).
  const plan_edge* find_reduce(int op, int replica) const;
  /// Ops (graph node ids, inputs included) with a replica on cluster node `node`.
  std::vector<int> ops_on(int node) const;
  /// (op, replica) pairs whose actor runs on cluster node `node`, in graph order.
  std::vector<std::pair<int, int>> replicas_on(int node) const;
};

/// The wiring of a placement: two plan_edges (forward and backward, consecutive ids from
/// `first_id`) for every graph edge whose ends are on different nodes (with replicas: for every
/// replica pair a route uses whose nodes differ), then R reduce edges (ring r -> (r + 1) % R) for
/// every op with parameters and R > 1 replicas; bytes from the shapes `g` was loaded with. Throws std::invalid_argument when `where` does not cover `g` or its stages,
/// stage_of_op and routes do not fit together.
plan make_plan(const graph& g, placement where, uint64_t first_id = 1);

/// Places `g` on `c` with the cluster file's policy, which receives `profile`, and wires it.
plan plan_run(const graph& g, const cluster_spec& c, const cluster_profile& profile, uint64_t first_id = 1);

/// The same placement and wiring with every edge given a fresh id from `first_id` (a re-wiring
/// that replaces every edge sender, e.g. to test that edges can be swapped on a live run).
plan renumber(plan p, uint64_t first_id);

/// The plan of a new placement for a running `before`: `after` is `before`'s graph wired under
/// `where` (new edges numbered from before.next_edge_id); every edge that keeps its key and both
/// ends keeps its id and codec, so diff(before, result) lists only the edges that must change and
/// their senders (and compression state) stay as they are. The schedule stays `before`'s.
plan replan(const graph& g, const plan& before, placement where);

/// One replica r >= 1 of an op that appears, goes or moves from one plan to the next.
struct replica_change {
  int op = -1;                  ///< graph node id
  int replica = 0;              ///< >= 1 (replica 0 is node_of_op: moved_ops)
  int from = -1;                ///< its node in the old plan, -1 when it is new
  int to = -1;                  ///< its node in the new plan, -1 when it goes away
  bool operator==(const replica_change& o) const {
    return op == o.op && replica == o.replica && from == o.from && to == o.to;
  }
};

/// What changes from one plan to the next. Edges are matched by (producer, consumer_index,
/// producer_replica, consumer_replica, kind): a match with other nodes is removed + added;
/// with the same nodes but another id or setting it is changed.
struct plan_diff {
  std::vector<int> moved_ops;                              ///< graph node ids whose node (replica 0) changed
  std::vector<std::pair<int, int>> moves;                  ///< (old, new) node of each moved_ops entry
  std::vector<replica_change> replicas;                    ///< replicas >= 1 added, removed or moved, by (op, replica)
  bool routes_changed = false;                             ///< micro-batches take other routes
  std::vector<plan_edge> added;                            ///< in the new plan only
  std::vector<plan_edge> removed;                          ///< in the old plan only
  std::vector<std::pair<plan_edge, plan_edge>> changed;    ///< (old, new)
  bool empty() const {
    return moved_ops.empty() && replicas.empty() && !routes_changed && added.empty() && removed.empty() && changed.empty();
  }
};

/// The difference between `before` and `after` (plans of the same graph).
plan_diff diff(const plan& before, const plan& after);

/// A printable summary: "3 ops move (a: n0 -> n1, ...), 2 edges added, ...", or "no change".
std::string format_diff(const graph& g, const cluster_spec& c, const plan_diff& d);

/// The placement table (format_placement) followed by one line per plan edge: id, direction,
/// "producer -> consumer", "from -> to" node names, bytes per micro-batch, codec.
std::string format_plan(const graph& g, const cluster_spec& c, const plan& p);

}  // namespace fusion
