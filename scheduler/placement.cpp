// Placement policies (even, explicit; OP-Fence in opfence.cpp) behind the placer interface, and
// the placement table.
#include "scheduler/placement.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "core/graph_names.hpp"
#include "scheduler/opfence.hpp"

namespace fusion {

namespace {

std::string at(const cluster_spec& c, int line) {
  return line > 0 ? c.file + ":" + std::to_string(line) + ": " : c.file + ": ";
}

class even_placer : public placer {
 public:
  const char* name() const override { return "even"; }

  // Balances estimated FLOPs only: node speeds and link rates in the profile are not used yet
  // (that is OP-Fence's job), so the profile is ignored.
  placement place(const graph& g, const cluster_spec& c, const cluster_profile&) const override {
    std::vector<double> flops = op_flops(g);
    std::vector<int> compute;
    std::vector<double> costs;
    for (auto& n : g.nodes)
      if (!n.is_input()) {
        compute.push_back(n.id);
        costs.push_back(flops[n.id]);
      }
    size_t parts = c.nodes.size();
    if (parts == 0) throw placement_error(at(c, 0) + "the cluster has no nodes");
    if (compute.size() < parts)
      throw placement_error(at(c, c.nodes[compute.size()].line) + "even placement gives every node at least one op, but model '" +
                            g.name + "' has " + std::to_string(compute.size()) + " ops for " + std::to_string(parts) +
                            " nodes (node '" + c.nodes[compute.size()].name + "' would stay idle)");
    std::vector<size_t> cuts = balanced_cuts(costs, parts);
    placement p;
    p.node_of_op.assign(g.nodes.size(), -1);
    for (size_t k = 0; k < parts; ++k)
      for (size_t i = cuts[k]; i < cuts[k + 1]; ++i) p.node_of_op[compute[i]] = static_cast<int>(k);
    place_inputs(g, p, std::vector<bool>(g.nodes.size(), false));
    return p;
  }
};

class explicit_placer : public placer {
 public:
  const char* name() const override { return "explicit"; }

  // The cluster file says where every op goes; nothing measured changes that. The profile only
  // deals the micro-batches of replicated stages by speed and checks their memory.
  placement place(const graph& g, const cluster_spec& c, const cluster_profile& profile) const override {
    const auto& assigns = c.placement.assigns;
    if (assigns.empty())
      throw placement_error(at(c, c.placement.line) + "explicit placement without assign entries");
    placement p;
    p.node_of_op.assign(g.nodes.size(), -1);
    std::vector<int> owner(g.nodes.size(), -1);  // assign index that matched each op
    std::vector<int> owner_line(g.nodes.size(), 0);
    for (size_t a = 0; a < assigns.size(); ++a) {
      const auto& as = assigns[a];
      for (size_t k = 0; k < as.ops.size(); ++k) {
        bool any = false;
        for (auto& n : g.nodes) {
          if (!glob_match(as.ops[k], n.name)) continue;
          any = true;
          if (owner[n.id] >= 0 && owner[n.id] != static_cast<int>(a))
            throw placement_error(at(c, as.op_lines[k]) + "op '" + n.name + "' matched by '" + as.ops[k] +
                                  "' for node '" + as.node + "' and by the assign for node '" +
                                  assigns[owner[n.id]].node + "' (line " + std::to_string(owner_line[n.id]) +
                                  "); every op must be assigned exactly once");
          owner[n.id] = static_cast<int>(a);
          owner_line[n.id] = as.op_lines[k];
          p.node_of_op[n.id] = as.node_index;
        }
        if (!any) {
          std::vector<std::string> names;
          for (auto& n : g.nodes) names.push_back(n.name);
          throw placement_error(at(c, as.op_lines[k]) + "pattern '" + as.ops[k] + "' for node '" + as.node +
                                "' matches no op of model '" + g.name + "'" + did_you_mean(as.ops[k], names));
        }
      }
    }
    // A fan-out node no pattern names (the model file does not have it) goes with its producer,
    // and place_fanouts then puts it with its consumers when they share a node.
    for (auto& n : g.nodes)
      if (n.fanout && owner[n.id] < 0 && owner[n.inputs.front()] >= 0) {
        owner[n.id] = owner[n.inputs.front()];
        p.node_of_op[n.id] = p.node_of_op[n.inputs.front()];
      }
    std::string missing;
    int count = 0;
    for (auto& n : g.nodes)
      if (!n.is_input() && owner[n.id] < 0) {
        if (++count <= 6) missing += (missing.empty() ? "" : ", ") + n.name;
      }
    if (count > 0)
      throw placement_error(at(c, c.placement.line) + "explicit placement leaves " + std::to_string(count) +
                            " op(s) of model '" + g.name + "' unassigned: " + missing + (count > 6 ? ", ..." : "") +
                            " (add them to an assign, e.g. ops: \"" + missing.substr(0, missing.find(',')) + "\")");
    std::vector<bool> fixed(g.nodes.size());
    for (size_t i = 0; i < fixed.size(); ++i) fixed[i] = owner[i] >= 0;
    place_inputs(g, p, fixed);
    return with_replicas(g, c, profile, std::move(p));
  }

 private:
  // The assigns with replica entries become replicated stages: routes dealt by each node's speed
  // on the stage's ops, every replica checked against its memory.
  static placement with_replicas(const graph& g, const cluster_spec& c, const cluster_profile& profile, placement p) {
    bool any = false;
    for (auto& as : c.placement.assigns) any = any || !as.replicas.empty();
    if (!any) return p;
    workload_estimator est(g, c, profile);
    std::vector<stage_replicas> stages;
    for (auto& as : c.placement.assigns) {
      if (as.replicas.empty()) continue;
      std::vector<int> ops;
      for (auto& n : g.nodes)
        if (p.node_of_op[n.id] == as.node_index) ops.push_back(n.id);
      stage_replicas st;
      st.nodes.push_back(as.node_index);
      st.nodes.insert(st.nodes.end(), as.replica_indices.begin(), as.replica_indices.end());
      for (int k : st.nodes) {
        double s = 0;
        for (int id : ops) s += (est.forward_s(id, k) + est.backward_s(id, k)) * est.quota_stretch(k);
        st.weights.push_back(s > 0 ? 1 / s : 1.0);
      }
      stages.push_back(std::move(st));
    }
    placement out = replicate(std::move(p), std::move(stages), est.micro_batches());
    // Memory per replica: parameters and optimizer state in full, activations of its micro-batches.
    for (auto& as : c.placement.assigns) {
      if (as.replicas.empty()) continue;
      int s = 0;
      for (size_t id = 0; id < out.node_of_op.size(); ++id)
        if (out.node_of_op[id] == as.node_index) s = out.stage_of_op[id];
      const std::vector<int> routed = routed_micro_batches(out, s);
      for (size_t r = 0; r < out.stages[s].nodes.size(); ++r) {
        const int k = out.stages[s].nodes[r];
        const double have = static_cast<double>(profile.nodes[k].memory_bytes);
        if (!(have > 0)) continue;
        double need = 0;
        for (auto& n : g.nodes) {
          if (out.stage_of_op[n.id] != s || n.is_input()) continue;
          need += est.memory_bytes(n.id) - (est.micro_batches() - routed[r]) * est.activation_bytes(n.id);
        }
        if (need > have) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "%.3g GiB, but node '%s' has %.3g GiB", need / double(1 << 30),
                        c.nodes[k].name.c_str(), have / double(1 << 30));
          const int line = r == 0 ? as.line : as.replica_lines[r - 1];
          throw placement_error(at(c, line) + "the stage of node '" + as.node + "' does not fit in memory: replica " +
                                std::to_string(r + 1) + " of " + std::to_string(out.stages[s].nodes.size()) +
                                " takes " + std::to_string(routed[r]) + " of " + std::to_string(est.micro_batches()) +
                                " micro-batches and needs " + buf +
                                " (fewer ops in this stage, more replicas or fewer micro-batches need less)");
        }
      }
    }
    return out;
  }
};

std::string human_flops(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", f / 1e9);
  return buf;
}

std::string mbit_text(double mbit) {
  std::ostringstream s;
  s << mbit;
  return s.str();
}

}  // namespace

void place_inputs(const graph& g, placement& p, const std::vector<bool>& fixed) {
  for (auto& n : g.nodes) {
    if (!n.is_input() || fixed[n.id]) continue;
    int first = -1;
    for (auto& e : n.consumers)
      if (first < 0 || e.node < first) first = e.node;
    // The loader rejects dead ends, so an input always has a consumer; 0 is only a fallback.
    p.node_of_op[n.id] = first >= 0 ? p.node_of_op[first] : 0;
  }
}

placement place_fanouts(const graph& g, placement p) {
  if (p.node_of_op.size() != g.nodes.size()) return p;  // make_plan names the mismatch
  const bool staged = !p.stages.empty() && p.stage_of_op.size() == g.nodes.size();
  // With stages the consumers must share a stage (and so its replicas), else a node.
  auto where = [&](int op) { return staged ? p.stage_of_op[op] : p.node_of_op[op]; };
  std::map<int, int> ops_at;  // compute ops per node (stage): a node left without one would idle
  for (auto& n : g.nodes)
    if (!n.is_input()) ++ops_at[where(n.id)];
  for (auto& n : g.nodes) {
    if (!n.fanout || n.consumers.empty()) continue;
    const int first = where(n.consumers.front().node);
    if (first < 0 || where(n.id) == first || ops_at[where(n.id)] < 2) continue;
    bool one = true;
    for (auto& e : n.consumers) one = one && where(e.node) == first;
    if (!one) continue;
    --ops_at[where(n.id)];
    ++ops_at[first];
    if (staged) {
      p.stage_of_op[n.id] = first;
      p.node_of_op[n.id] = p.stages[first].nodes.front();
    } else {
      p.node_of_op[n.id] = first;
    }
  }
  return p;
}

std::unique_ptr<placer> make_placer(placement_policy policy) {
  switch (policy) {
    case placement_policy::opfence: return std::make_unique<opfence_placer>();
    case placement_policy::opfence_replicas: {
      opfence_options o;
      o.replicas = true;
      return std::make_unique<opfence_placer>(o);
    }
    case placement_policy::even: return std::make_unique<even_placer>();
    case placement_policy::explicit_ops: return std::make_unique<explicit_placer>();
  }
  throw placement_error("unknown placement policy " + std::to_string(static_cast<int>(policy)));
}

placement place_ops(const graph& g, const cluster_spec& c, const cluster_profile& profile) {
  return place_fanouts(g, make_placer(c.placement.policy)->place(g, c, profile));
}

placement place_ops(const graph& g, const cluster_spec& c) { return place_ops(g, c, profile_from_cluster(c)); }

std::string format_op_runs(const graph& g, const std::vector<int>& ops) {
  std::string list;
  for (size_t i = 0; i < ops.size();) {
    size_t j = i;
    while (j + 1 < ops.size() && ops[j + 1] == ops[j] + 1) ++j;
    list += (list.empty() ? "" : ", ") + g.nodes[ops[i]].name;
    if (j > i) list += " .. " + g.nodes[ops[j]].name;
    i = j + 1;
  }
  return list;
}

std::string seconds_text(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  return buf;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::vector<double> op_flops(const graph& g) {
  std::vector<double> out(g.nodes.size(), 0.0);
  for (auto& n : g.nodes) {
    if (!n.impl) continue;
    std::vector<shape_t> in;
    for (int i : n.inputs) in.push_back(g.nodes[i].shape);
    op_cost cost = n.impl->cost(in);
    out[n.id] = cost.flops_forward + cost.flops_backward;
  }
  return out;
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // No flags: '*' and '?' match '.' and '/' too, leading ones included, so "h0.*" takes every op
  // of block h0 and "*" every op.
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::vector<size_t> balanced_cuts(const std::vector<double>& costs, size_t parts) {
  const size_t n = costs.size();
  if (parts < 1 || parts > n) throw placement_error("balanced_cuts: need 1 <= parts <= " + std::to_string(n));
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[k][i]: (bottleneck, sum of squares) of the first i ops in k+1 runs; from[k][i]: start
  // of the last run. Lexicographic order: smallest bottleneck first, then the evenest split.
  using score = std::pair<double, double>;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<score>> best(parts, std::vector<score>(n + 1, {inf, inf}));
  std::vector<std::vector<size_t>> from(parts, std::vector<size_t>(n + 1, 0));
  for (size_t i = 1; i <= n; ++i) best[0][i] = {prefix[i], prefix[i] * prefix[i]};
  for (size_t k = 1; k < parts; ++k)
    for (size_t i = k + 1; i <= n; ++i)
      for (size_t j = i - 1; j >= k; --j) {
        double last = prefix[i] - prefix[j];
        // Runs only grow as j moves left: once the last run alone exceeds the best bottleneck,
        // no further j can win.
        if (last > best[k][i].first) break;
        score s{std::max(best[k - 1][j].first, last), best[k - 1][j].second + last * last};
        if (s < best[k][i]) {
          best[k][i] = s;
          from[k][i] = j;
        }
        if (j == k) break;
      }
  std::vector<size_t> cuts(parts + 1, 0);
  cuts[parts] = n;
  for (size_t k = parts - 1, i = n; k > 0; --k) {
    i = from[k][i];
    cuts[k] = i;
  }
  return cuts;
}

std::vector<placement_row> describe_placement(const graph& g, const cluster_spec& c, const placement& p) {
  std::vector<placement_row> rows(c.nodes.size());
  for (size_t k = 0; k < rows.size(); ++k) rows[k].node = static_cast<int>(k);
  std::vector<double> flops = op_flops(g);
  double total = 0;
  for (double f : flops) total += f;
  const double rows_of_routes = static_cast<double>(std::max<size_t>(p.routes.size(), 1));
  std::vector<std::vector<int>> routed(p.stages.size());
  for (size_t s = 0; s < p.stages.size(); ++s) routed[s] = routed_micro_batches(p, static_cast<int>(s));
  for (auto& n : g.nodes)
    for (int r = 0; r < p.replicas(n.id); ++r) {
      int k = p.node_of(n.id, r);
      if (k < 0 || k >= static_cast<int>(rows.size())) continue;
      double fraction = 1;
      if (!p.stages.empty()) {
        const int s = p.stage_of(n.id);
        rows[k].stage = s;
        rows[k].replica = r;
        rows[k].replicas = p.replicas(n.id);
        rows[k].micro_batches = routed[s][r];
        fraction = routed[s][r] / rows_of_routes;
      }
      rows[k].ops.push_back(n.id);
      rows[k].compute_ops += n.is_input() ? 0 : 1;
      rows[k].flops += flops[n.id] * fraction;
    }
  for (auto& r : rows) r.share = total > 0 ? r.flops / total : 0;
  return rows;
}

std::string format_placement(const graph& g, const cluster_spec& c, const placement& p) {
  auto rows = describe_placement(g, c, p);
  std::ostringstream out;
  out << "placement of model '" << g.name << "' (B=" << g.batch << ", " << g.nodes.size() << " graph nodes) on cluster '"
      << c.name << "' (" << c.nodes.size() << " nodes, policy " << placement_policy_names()[static_cast<int>(c.placement.policy)]
      << ")\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %-10s %-8s %5s %12s %7s  %s\n", "node", "site", "device", "ops", "GFLOP/step",
                "share", "ops (graph order)");
  out << line;
  for (auto& r : rows) {
    const auto& cn = c.nodes[r.node];
    std::string list = format_op_runs(g, r.ops);
    std::snprintf(line, sizeof line, "%-12s %-10s %-8s %5d %12s %6.1f%%  ", cn.name.c_str(), cn.site.c_str(),
                  cn.device.c_str(), r.compute_ops, human_flops(r.flops).c_str(), 100 * r.share);
    out << line << (list.empty() ? "(idle)" : list);
    if (r.replicas > 1)
      out << " [stage " << r.stage << ", replica " << r.replica + 1 << " of " << r.replicas << ", " << r.micro_batches
          << " of " << p.routes.size() << " micro-batches]";
    out << "\n";
  }
  // Cross-node edges: what each step sends over which link (forward activations; backward
  // gradients of the same size come back).
  std::map<std::pair<int, int>, bool> seen;
  for (auto& n : g.nodes)
    for (auto& e : n.consumers) {
      int a = p.node_of_op[n.id], b = p.node_of_op[e.node];
      if (a == b || !seen.emplace(std::pair{n.id, b}, true).second) continue;
      double elems = 1;
      for (auto d : n.shape) elems *= static_cast<double>(d);
      double bytes = elems * (n.type == dtype::f64 ? 8 : 4);
      double mbit = c.node_link_mbit(a, b);
      out << "edge " << n.name << " -> " << g.nodes[e.node].name << ": " << c.nodes[a].name << " -> " << c.nodes[b].name
          << ", " << human_bytes(bytes) << " per batch, link "
          << (std::isinf(mbit) ? std::string("unshaped") : mbit_text(mbit) + " Mbit/s")
          << "\n";
    }
  return out.str();
}

}  // namespace fusion
