// The profile a cluster file implies, and the op signatures measured times are keyed by. Saving
// and loading profiles: scheduler/profile_json.cpp.
#include "scheduler/profile.hpp"

#include <cmath>
#include <set>

namespace fusion {

const link_profile* cluster_profile::find_link(int site_a, int site_b) const {
  for (auto& l : links)
    if ((l.site_a == site_a && l.site_b == site_b) || (l.site_a == site_b && l.site_b == site_a)) return &l;
  return nullptr;
}

cluster_profile profile_from_cluster(const cluster_spec& c) {
  cluster_profile p;
  p.nodes.reserve(c.nodes.size());
  for (auto& n : c.nodes) {
    node_profile np;
    np.name = n.name;
    np.site = n.site;
    np.device = n.device;
    // What the file states stands in for a measurement; 0 stays "unknown".
    np.gflops = n.gflops;
    np.memory_bytes = static_cast<uint64_t>(std::llround(n.memory_gib * double(uint64_t{1} << 30)));
    np.cpu_share = n.cpu_share;
    // A stated cap is a CFS quota: scripts/run-sites.sh sets it with the default 0.1 s period.
    if (n.cpu_share > 0) np.quota = {n.cpu_share, 0.1};
    p.nodes.push_back(np);
  }
  for (auto& s : c.sites) p.site_names.push_back(s.name);
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

std::string op_key(const graph& g, int id) {
  const graph_node& n = g.nodes.at(id);
  std::string key = n.kind + "{";
  bool first = true;
  for (auto& [k, v] : n.attrs.values()) {
    key += (first ? "" : ",") + k + "=" + v;
    first = false;
  }
  key += "}(";
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const graph_node& in = g.nodes[n.inputs[i]];
    key += i ? ";" : "";
    for (size_t d = 0; d < in.shape.size(); ++d) key += (d ? "x" : "") + std::to_string(in.shape[d]);
    if (in.type != dtype::f32) key += in.type == dtype::i32 ? ":i32" : ":f64";
  }
  return key + ")";
}

std::vector<int> distinct_ops(const graph& g) {
  std::vector<int> out;
  std::set<std::string> seen;
  for (auto& n : g.nodes)
    if (!n.is_input() && seen.insert(op_key(g, n.id)).second) out.push_back(n.id);
  return out;
}

}  // namespace fusion
