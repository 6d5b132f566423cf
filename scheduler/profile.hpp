// What placement may know about a cluster besides its file: per node what its hello carried
// (device, measured compute rate, memory) and per site pair the measured link. Before anything
// is measured, profile_from_cluster gives the cluster file's view.
// Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cluster.hpp"

namespace fusion {

/// What is known about one node when the run is planned: what its hello carried (the scheduler
/// issue adds timed op kinds).
struct node_profile {
  std::string name;
  std::string site;
  std::string device = "cpu";   ///< "cpu" or "cuda:N"
  double gflops = 0;            ///< measured sgemm rate; 0 when unknown
  uint64_t memory_bytes = 0;    ///< 0 when unknown
};

/// A measured (or, before measuring, configured) site-to-site link.
struct link_profile {
  int site_a = -1, site_b = -1; ///< indices into cluster_spec::sites
  double mbit = 0;              ///< per direction
  double rtt_s = 0;             ///< round-trip time; 0 when unknown
};

/// Everything placement may use besides the graph and the cluster file.
struct cluster_profile {
  std::vector<node_profile> nodes;  ///< by cluster node index
  std::vector<link_profile> links;  ///< per measured site pair
};

/// The profile a cluster file implies before anything is measured: names, sites and devices of
/// its nodes, its links at their configured rates.
cluster_profile profile_from_cluster(const cluster_spec& c);

}  // namespace fusion
