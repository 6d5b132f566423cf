// Re-planning on the survivors of a node loss: a cluster of the surviving nodes is planned like
// a fresh run, then mapped back to the whole cluster's node indices (scheduler/survivors.hpp).
#include "scheduler/survivors.hpp"

#include <stdexcept>

#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

namespace {

// The explicit assignments on the survivors: lost replicas dropped, a lost first node replaced
// by the next surviving replica. False when some assignment keeps no node at all.
bool keep_explicit(cluster_placement& p, const std::vector<bool>& alive, std::string& note) {
  for (auto& a : p.assigns) {
    std::vector<std::string> names;
    std::vector<int> indices, lines;
    for (size_t r = 0; r < a.replica_indices.size(); ++r)
      if (alive[a.replica_indices[r]]) {
        names.push_back(a.replicas[r]);
        indices.push_back(a.replica_indices[r]);
        lines.push_back(r < a.replica_lines.size() ? a.replica_lines[r] : a.line);
      } else {
        note += (note.empty() ? "" : "; ") + std::string("replica on lost node '") + a.replicas[r] + "' dropped";
      }
    if (!alive[a.node_index]) {
      if (indices.empty()) {
        note += (note.empty() ? "" : "; ") + std::string("the explicit placement puts ops on lost node '") + a.node +
                "' with no surviving replica: re-planned with OP-Fence on the survivors";
        return false;
      }
      note += (note.empty() ? "" : "; ") + std::string("the ops of lost node '") + a.node + "' stay on their replica '" +
              names.front() + "'";
      a.node = names.front();
      a.node_index = indices.front();
      names.erase(names.begin());
      indices.erase(indices.begin());
      lines.erase(lines.begin());
    }
    a.replicas = std::move(names);
    a.replica_indices = std::move(indices);
    a.replica_lines = std::move(lines);
  }
  return true;
}

}  // namespace

survivor_placement place_on_survivors(const graph& g, const cluster_spec& c, const cluster_profile& profile,
                                      const std::vector<bool>& alive, const compression_config& comp,
                                      std::optional<pipeline_schedule> schedule) {
  if (alive.size() != c.nodes.size() || profile.nodes.size() != c.nodes.size())
    throw std::invalid_argument("place_on_survivors: alive and profile must cover every node of " + c.file);
  // Survivor k is node full[k] of the whole cluster; index_of maps back (-1: lost).
  std::vector<int> full, index_of(c.nodes.size(), -1);
  for (size_t i = 0; i < c.nodes.size(); ++i)
    if (alive[i]) {
      index_of[i] = static_cast<int>(full.size());
      full.push_back(static_cast<int>(i));
    }
  if (full.empty()) throw std::runtime_error("no node of " + c.file + " is left to train on");
  survivor_placement out;
  cluster_spec s = c;  // sites and links stay: profile links name sites by index
  cluster_profile p = profile;
  s.nodes.clear();
  p.nodes.clear();
  for (int i : full) {
    s.nodes.push_back(c.nodes[i]);
    p.nodes.push_back(profile.nodes[i]);
  }
  if (s.placement.policy == placement_policy::explicit_ops) {
    if (keep_explicit(s.placement, alive, out.note)) {
      for (auto& a : s.placement.assigns) {
        a.node_index = index_of[a.node_index];
        for (auto& r : a.replica_indices) r = index_of[r];
      }
    } else {
      s.placement.policy = placement_policy::opfence;
      s.placement.assigns.clear();
    }
  }
  workload_estimator est(g, s, p);
  plan planned = plan_compressed_run(est, p, comp, 1, nullptr, schedule);
  out.where = std::move(planned.where);
  for (auto& n : out.where.node_of_op) n = full.at(n);
  for (auto& st : out.where.stages)
    for (auto& n : st.nodes) n = full.at(n);
  return out;
}

placement place_on_usable(const workload_estimator& est, const std::vector<bool>& usable,
                          const compression_config& comp, std::optional<pipeline_schedule> schedule) {
  const cluster_spec& c = est.cluster();
  if (usable.size() != c.nodes.size())
    throw std::invalid_argument("place_on_usable: usable must cover every node of " + c.file);
  std::vector<int> full;
  cluster_spec s = c;
  s.nodes.clear();
  s.placement.assigns.clear();
  for (size_t i = 0; i < c.nodes.size(); ++i)
    if (usable[i]) {
      full.push_back(static_cast<int>(i));
      s.nodes.push_back(c.nodes[i]);
    }
  if (full.empty()) throw std::runtime_error("no node of " + c.file + " can take work");
  if (s.placement.policy == placement_policy::explicit_ops) s.placement.policy = placement_policy::opfence;
  const workload_estimator sub = est.restricted(s, full);
  placement where = plan_compressed_run(sub, sub.profile(), comp, 1, nullptr, schedule).where;
  for (auto& n : where.node_of_op) n = full.at(n);
  for (auto& st : where.stages)
    for (auto& n : st.nodes) n = full.at(n);
  return where;
}

}  // namespace fusion
