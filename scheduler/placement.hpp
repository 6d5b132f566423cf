// Operator placement: which cluster node runs each node of the OP-DAG. One interface (placer),
// one implementation per placement_policy; place_ops dispatches on the cluster file's policy.
// Plain C++ (graph + cluster + profile in, placement out), tested without actors.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
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

/// Where every graph node runs.
struct placement {
  /// For every graph node id (inputs included): index into cluster_spec::nodes.
  std::vector<int> node_of_op;
};

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
};

/// Per cluster node (file order): its ops and estimated FLOPs share.
std::vector<placement_row> describe_placement(const graph& g, const cluster_spec& c, const placement& p);

/// A printable table: one line per node with site, device, op count, FLOPs share and the ops
/// (contiguous runs written "first .. last"), then the cross-node edges with their link rate.
std::string format_placement(const graph& g, const cluster_spec& c, const placement& p);

}  // namespace fusion
