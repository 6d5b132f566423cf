// What placement may know about a cluster besides its file: per node what it measured at join
// (device, sgemm rate, memory, the time of every op kind of the run at the run's micro-batch
// shapes, its effective CPU share) and per site pair the probed link. Before anything is
// measured, profile_from_cluster gives the cluster file's view (stated rates, link hints).
// A profile can be saved as JSON and loaded on a restart instead of measuring again.
// Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "ops/cpu_quota.hpp"

namespace fusion {

/// A profile-file error; what() reads "FILE: message" naming the file and the field.
struct profile_error : error {
  using error::error;
};

/// Measured time of one op signature on one node, per micro-batch, in seconds.
struct op_timing {
  double forward_s = 0;
  double backward_s = 0;
  double update_s = 0;          ///< one optimizer update of the op's parameters (0 without any)
  bool operator==(const op_timing&) const = default;
};

/// What is known about one node when the run is planned.
struct node_profile {
  std::string name;
  std::string site;
  std::string device = "cpu";   ///< "cpu" or "cuda:N"
  double gflops = 0;            ///< measured sgemm rate, or the cluster file's stated rate; 0 when unknown
  uint64_t memory_bytes = 0;    ///< free memory for the run; 0 when unknown (no limit)
  double cpu_share = 0;         ///< measured CPU share (cores) the node's work got; 0 when unknown
  /// The node's CFS CPU quota (none: cores 0). Where it binds (below one core) the ops run at full
  /// speed (`ops` holds CPU times) but at most cores x period_s of each period (the estimator's
  /// simulation keeps that budget); a cluster file's stated cap stands for one with a 0.1 s period.
  cpu_quota quota;
  /// Measured op times by op_key(); empty when the node was not profiled (rates then come from
  /// gflops and op::cost).
  std::map<std::string, op_timing> ops;
  bool operator==(const node_profile&) const = default;
};

/// A measured (or, before measuring, configured) site-to-site link.
struct link_profile {
  int site_a = -1, site_b = -1; ///< indices into cluster_spec::sites
  double mbit = 0;              ///< per direction
  double rtt_s = 0;             ///< round-trip time; 0 when unknown
  bool measured = false;        ///< probed (true) or the cluster file's hint (false)
  bool operator==(const link_profile&) const = default;
};

/// Everything placement may use besides the graph and the cluster file.
struct cluster_profile {
  std::vector<node_profile> nodes;  ///< by cluster node index
  std::vector<link_profile> links;  ///< per site pair (each unordered pair at most once)
  /// Site names by cluster_spec::sites index (what profile files name links by).
  std::vector<std::string> site_names;
  std::string model;                ///< the model the op times were measured for (informational)
  int64_t micro_batch = 0;          ///< the micro-batch rows they were measured at (0: none)
  /// Micro-batches per step of the run being planned (not saved: a run setting, set by the
  /// coordinator and fusion-cluster plan before placing).
  int micro_batches = 1;

  /// The link between two sites (either order), or null.
  const link_profile* find_link(int site_a, int site_b) const;
};

/// The profile a cluster file implies before anything is measured: names, sites and devices of
/// its nodes with their stated gflops and memory_gib, its links at their configured rates.
cluster_profile profile_from_cluster(const cluster_spec& c);

/// The signature of graph node `id` that measured op times are keyed by: kind, attributes and
/// input shapes ("linear{out=768}(4x128x256)"). Two ops with one key cost the same.
std::string op_key(const graph& g, int id);

/// The distinct op signatures of `g` (one representative graph node id per op_key, graph
/// order, inputs excluded): what a node times at join.
std::vector<int> distinct_ops(const graph& g);

/// Writes `p` as JSON to `path` (format: docs/scheduler.md). Throws profile_error when the file
/// cannot be written.
void save_profile(const std::string& path, const cluster_profile& p);

/// Reads a profile written by save_profile and checks it against `c`: every node of the cluster
/// file present by name (in any order; the result is in cluster order), sites known. Throws
/// profile_error naming the file and what is wrong (malformed JSON, a missing node, a negative
/// rate, ...).
cluster_profile load_profile(const std::string& path, const cluster_spec& c);

}  // namespace fusion
