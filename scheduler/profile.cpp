// The profile a cluster file implies: one node_profile per node, one link_profile per link.
#include "scheduler/profile.hpp"

namespace fusion {

cluster_profile profile_from_cluster(const cluster_spec& c) {
  cluster_profile p;
  p.nodes.reserve(c.nodes.size());
  for (auto& n : c.nodes) {
    node_profile np;
    np.name = n.name;
    np.site = n.site;
    np.device = n.device;
    // Nothing measured yet: gflops and memory_bytes stay 0 ("unknown").
    p.nodes.push_back(np);
  }
  p.links.reserve(c.links.size());
  for (auto& l : c.links) {
    link_profile lp;
    lp.site_a = c.find_site(l.a);
    lp.site_b = c.find_site(l.b);
    lp.mbit = l.mbit;
    p.links.push_back(lp);
  }
  return p;
}

}  // namespace fusion
