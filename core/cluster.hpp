// The cluster: sites, nodes (one process per device) at each site, site-to-site link bandwidth,
// the coordinator address and the placement policy, loaded from a protobuf text cluster file
// (schema: proto/cluster.proto, reference: docs/cluster.md).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/result.hpp"

namespace fusion {

/// A cluster-file error; what() reads "FILE:LINE: message".
struct cluster_error : error {
  using error::error;
};

/// A group of nodes on one fast network.
struct cluster_site {
  std::string name;
  int line = 0;                 ///< line of the site in the cluster file
};

/// One node process and the device it drives.
struct cluster_node {
  std::string name;             ///< the name the node registers under
  std::string site;             ///< name of its site
  int site_index = -1;          ///< index into cluster_spec::sites
  std::string device = "cpu";   ///< "cpu" or "cuda:N"
  int cuda_device = -1;         ///< N of "cuda:N", -1 for "cpu"
  double cpu_share = 0;         ///< emulated cap in cores (0 < share); 0: uncapped
  double gflops = 0;            ///< stated device rate in GFLOP/s; 0: measure at join
  double memory_gib = 0;        ///< stated memory in GiB; 0: measure at join
  /// False: behind a firewall; peers sending to it have it dial them (connection reversal).
  bool accept_inbound = true;
  /// Listed in `spare`: the run does not wait for it at start; it is admitted whenever it joins.
  bool spare = false;
  int spare_line = 0;           ///< line of its `spare` entry (0: not a spare)
  int line = 0;
};

/// A symmetric site-to-site link: each direction carries `mbit` Mbit/s.
struct cluster_link {
  std::string a;                ///< site name
  std::string b;                ///< site name, != a
  double mbit = 0;              ///< > 0
  int line = 0;
};

/// How operators are placed on nodes. A new policy adds a value here, its name in
/// placement_policy_names() and its placer in scheduler/placement.cpp.
enum class placement_policy {
  opfence,       ///< the default: fences of fast links, a chain, an exact DP over cut points, one node per op (docs/scheduler.md)
  even,          ///< contiguous stages of equal estimated FLOPs, one per node, in file order
  explicit_ops,  ///< "explicit": the assign entries say which node runs which op
  /// "opfence-replicas": OP-Fence that also plans stage replicas where they pay (fusion-cluster
  /// plan and the estimator predict such plans, fusion-train runs them; docs/scheduler.md).
  opfence_replicas,
};

/// Whether `p` is OP-Fence, with or without replicas.
inline bool is_opfence(placement_policy p) {
  return p == placement_policy::opfence || p == placement_policy::opfence_replicas;
}

/// The policy names accepted in `placement { policy: ... }`, indexed by placement_policy.
const std::vector<std::string>& placement_policy_names();

/// The policy called `name` in placement_policy_names(), or nullopt.
std::optional<placement_policy> find_placement_policy(const std::string& name);

/// One explicit assignment: op names or glob patterns ('*' any run, '?' one character).
struct cluster_assign {
  std::string node;             ///< cluster node name
  int node_index = -1;          ///< index into cluster_spec::nodes
  std::vector<std::string> ops; ///< names or patterns
  std::vector<int> op_lines;    ///< line of each entry of `ops`
  /// Further replicas of the same ops (stage replicas): node names, their indices into
  /// cluster_spec::nodes and lines. Empty: `node` alone holds them.
  std::vector<std::string> replicas;
  std::vector<int> replica_indices;
  std::vector<int> replica_lines;
  int line = 0;                 ///< line of the assign
};

/// The placement section.
struct cluster_placement {
  placement_policy policy = placement_policy::opfence;
  std::vector<cluster_assign> assigns;  ///< only for placement_policy::explicit_ops
  int line = 0;                 ///< line of `placement` (0 when absent)
};

/// A loaded, validated cluster file.
struct cluster_spec {
  std::string name;
  std::string file;             ///< path it was loaded from (error messages name it)
  std::string coordinator_host = "127.0.0.1";
  int coordinator_port = 0;     ///< 0: any free port
  std::vector<cluster_site> sites;   ///< file order
  std::vector<cluster_node> nodes;   ///< file order; stage k of an even placement runs on nodes[k]
  std::vector<cluster_link> links;   ///< file order
  cluster_placement placement;

  /// Site index by name, or -1.
  int find_site(const std::string& name) const;
  /// Node index by name, or -1.
  int find_node(const std::string& name) const;
  /// Bandwidth between two sites in Mbit/s, either order. Infinity means unshaped: the same
  /// site, or a pair without a link. Throws cluster_error for an unknown site name.
  double link_mbit(const std::string& site_a, const std::string& site_b) const;
  /// Bandwidth between the sites of two nodes (by index), as link_mbit.
  double node_link_mbit(int node_a, int node_b) const;
  /// Names of the nodes with accept_inbound false, in file order.
  std::vector<std::string> firewalled_nodes() const;
  /// How many nodes a run waits for at start: those not listed in `spare`.
  size_t required_nodes() const;
};

/// Splits "HOST:PORT" or "[IPV6]:PORT" (a node's coordinator, the coordinator's listen address);
/// throws std::runtime_error naming `what` when the value is malformed or the port is not 0..65535.
std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what);

/// Loads and validates a cluster file. Throws cluster_error "FILE:LINE: message" for: parse
/// errors, bad, unknown or duplicate site and node names, a node on an unknown site, a bad
/// device, links to unknown sites or to the same site, duplicate links, mbit <= 0, a bad
/// coordinator, an unknown placement policy, bad explicit assignments and bad `spare` entries
/// (an unknown or repeated node, a node an explicit assign names, every node a spare).
cluster_spec load_cluster(const std::string& path);

/// Same, from text already in memory; `path` is used only in messages.
cluster_spec parse_cluster(const std::string& text, const std::string& path);

}  // namespace fusion
