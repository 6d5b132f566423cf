// A plan's predicted cost per stage and per cut, and its table.
#include "scheduler/plan_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "scheduler/placement.hpp"

namespace fusion {

namespace {

std::string rate_text(double mbit) {
  if (std::isinf(mbit)) return "local";
  char buf[32];
  if (mbit >= 1000) std::snprintf(buf, sizeof buf, "%.3g Gbit/s", mbit / 1000);
  else std::snprintf(buf, sizeof buf, "%.3g Mbit/s", mbit);
  return buf;
}

}  // namespace

plan_report report_plan(const workload_estimator& est, const plan& p, double tokens_per_step) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  step_estimate e = est.simulate(p);
  plan_report r;
  r.step_s = e.step_s;
  r.pipeline_s = e.pipeline_s;
  r.optimizer_s = e.optimizer_s;
  r.tokens_per_s = e.step_s > 0 ? tokens_per_step / e.step_s : 0;
  r.allreduce_bytes = e.allreduce_bytes;
  r.allreduce_s = e.allreduce_s;
  r.allreduce_exposed_s = e.allreduce_exposed_s;
  const placement& w = p.where;
  std::vector<stage_report> by_node(c.nodes.size());
  for (auto& n : g.nodes)
    if (!n.is_input())
      for (int rep = 0; rep < w.replicas(n.id); ++rep) {
        auto& s = by_node[w.node_of(n.id, rep)];
        s.ops.push_back(n.id);
        s.replica = rep;
        s.replicas = w.replicas(n.id);
      }
  std::vector<std::vector<int>> routed(w.stages.size());
  for (size_t st = 0; st < w.stages.size(); ++st) routed[st] = routed_micro_batches(w, static_cast<int>(st));
  for (size_t k = 0; k < by_node.size(); ++k) {
    auto& s = by_node[k];
    s.node = static_cast<int>(k);
    s.micro_batches = est.micro_batches();
    if (!w.stages.empty() && !s.ops.empty()) s.micro_batches = routed[w.stage_of(s.ops.front())][s.replica];
    s.compute_s = k < e.node_compute_s.size() ? e.node_compute_s[k] : 0;
    s.memory_bytes = k < e.node_memory_bytes.size() ? e.node_memory_bytes[k] : 0;
    s.capacity_bytes = static_cast<double>(est.profile().nodes[k].memory_bytes);
    if (s.ops.empty()) r.idle_nodes.push_back(static_cast<int>(k));
    else r.stages.push_back(std::move(s));
  }
  std::sort(r.stages.begin(), r.stages.end(), [](auto& a, auto& b) {
    return a.ops.front() != b.ops.front() ? a.ops.front() < b.ops.front() : a.replica < b.replica;
  });
  for (size_t i = 0; i < r.stages.size(); ++i)
    r.stages[i].stage = i == 0 ? 0 : r.stages[i - 1].stage + (r.stages[i].replica == 0 ? 1 : 0);
  r.nodes_used = static_cast<int>(r.stages.size());
  r.stage_count = r.stages.empty() ? 0 : r.stages.back().stage + 1;
  for (size_t i = 0; i < p.edges.size(); ++i) {
    const plan_edge& pe = p.edges[i];
    if (!pe.forward()) continue;
    cut_report cr;
    cr.producer = pe.producer;
    cr.consumer = pe.consumer;
    cr.from = pe.from;
    cr.to = pe.to;
    cr.bytes_per_micro_batch = static_cast<double>(wire_bytes_per_micro_batch(pe));
    cr.mbit = est.link_mbit(pe.from, pe.to);
    cr.transfer_s = i < e.edge_s.size() ? e.edge_s[i] : 0;
    r.cuts.push_back(cr);
  }
  return r;
}

void check_plan_fits(const workload_estimator& est, const plan_report& r) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  for (const auto& s : r.stages) {
    if (s.capacity_bytes <= 0 || s.memory_bytes <= s.capacity_bytes) continue;
    const auto policy = placement_policy_names()[static_cast<int>(c.placement.policy)];
    throw placement_error(c.file + ": model '" + g.name + "' does not fit with policy " + policy + ": node '" +
                          c.nodes[s.node].name + "' has " + human_bytes(s.capacity_bytes) + " of memory, and its stage " +
                          std::to_string(s.stage) + " (" + format_op_runs(g, s.ops) + ") needs " +
                          human_bytes(s.memory_bytes) + " with " + std::to_string(est.micro_batches()) +
                          " micro-batches per step (policy opfence places by memory; fewer or smaller micro-batches "
                          "need less)");
  }
}

std::string format_plan_report(const workload_estimator& est, const plan_report& r) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-8s %-10s %-8s %-8s %5s %11s %19s  %s\n", "stage", "node", "site", "device", "ops",
                "compute/step", "memory (of node)", "ops (graph order)");
  out << line;
  for (size_t k = 0; k < r.stages.size(); ++k) {
    const auto& s = r.stages[k];
    const auto& n = c.nodes[s.node];
    std::string mem = human_bytes(s.memory_bytes) + " (" + (s.capacity_bytes > 0 ? human_bytes(s.capacity_bytes) : "?") + ")";
    // "3" for a stage of one node, "3.1/2" for replica 1 of stage 3's two.
    std::string id = std::to_string(s.stage);
    if (s.replicas > 1) id += "." + std::to_string(s.replica) + "/" + std::to_string(s.replicas);
    std::snprintf(line, sizeof line, "%-8s %-10s %-8s %-8s %5zu %11s %19s  ", id.c_str(), n.name.c_str(), n.site.c_str(),
                  n.device.c_str(), s.ops.size(), seconds_text(s.compute_s).c_str(), mem.c_str());
    out << line;
    if (s.replica > 0) out << "(replica of stage " << s.stage << ")";
    else out << format_op_runs(g, s.ops);
    if (s.replicas > 1) out << " [" << s.micro_batches << " of " << est.micro_batches() << " micro-batches]";
    out << "\n";
  }
  for (int k : r.idle_nodes)
    out << "idle  " << c.nodes[k].name << " (site " << c.nodes[k].site << "): no ops (its links or speed do not pay)\n";
  // Cuts between replicas repeat the same graph edge: one line per (edge, node pair) is enough.
  for (auto& x : r.cuts) {
    std::snprintf(line, sizeof line, "cut   %s -> %s: %s -> %s, %s per micro-batch, link %s, %s per step each way\n",
                  g.nodes[x.producer].name.c_str(), g.nodes[x.consumer].name.c_str(), c.nodes[x.from].name.c_str(),
                  c.nodes[x.to].name.c_str(), human_bytes(x.bytes_per_micro_batch).c_str(), rate_text(x.mbit).c_str(),
                  seconds_text(x.transfer_s).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line,
                "predicted step %s (pipeline %s + optimizer %s) for %d micro-batches: %.0f %s/s\n",
                seconds_text(r.step_s).c_str(), seconds_text(r.pipeline_s).c_str(), seconds_text(r.optimizer_s).c_str(),
                est.micro_batches(), r.tokens_per_s, g.is_text() ? "tokens" : "images");
  out << line;
  std::snprintf(line, sizeof line, "%d nodes in %d stages", r.nodes_used, r.stage_count);
  out << line;
  if (r.allreduce_bytes > 0)
    out << "; gradient all-reduce " << human_bytes(r.allreduce_bytes) << " per step, " << seconds_text(r.allreduce_s)
        << " alone, " << seconds_text(r.allreduce_exposed_s) << " not hidden by the backward";
  out << "\n";
  return out.str();
}

}  // namespace fusion
