// train.micro-batches = auto (scheduler/micro_batches.hpp): candidates, the efficiency model,
// the rescaled profile, the simulation of every candidate and the pick.
#include "scheduler/micro_batches.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "scheduler/estimator.hpp"
#include "scheduler/placement.hpp"  // human_bytes

namespace fusion {

std::vector<int64_t> micro_batch_candidates(int64_t batch, int64_t max) {
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= batch && m <= max; ++m)
    if (batch % m == 0) out.push_back(m);
  return out;
}

double op_rows(const graph& g, int id) {
  const graph_node& n = g.nodes.at(static_cast<size_t>(id));
  if (n.inputs.empty()) return 1;
  const shape_t& s = g.nodes.at(static_cast<size_t>(n.inputs.front())).shape;
  if (s.size() < 2) return 1;  // a vector or a scalar: one row
  double rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) rows *= static_cast<double>(s[i]);
  return std::max(rows, 1.0);
}

double gemm_efficiency(double rows, double half_rows) {
  if (!(half_rows > 0)) return 1;
  return rows / (rows + half_rows);
}

double rescale_op_seconds(double t, double rows_from, double rows_to, double half_rows) {
  if (!(rows_from > 0) || !(rows_to > 0)) return t;
  return t * (rows_to / rows_from) * gemm_efficiency(rows_from, half_rows) / gemm_efficiency(rows_to, half_rows);
}

cluster_profile rescale_profile(const cluster_profile& p, const graph& from, const graph& to, int micro_batches,
                                const micro_batch_options& o) {
  if (from.nodes.size() != to.nodes.size())
    throw std::invalid_argument("rescale_profile: the graphs have " + std::to_string(from.nodes.size()) + " and " +
                                std::to_string(to.nodes.size()) + " nodes: not one model at two batch sizes");
  cluster_profile out = p;
  out.micro_batch = to.batch;
  out.micro_batches = micro_batches;
  for (auto& node : out.nodes) {
    const double half = node.device.rfind("cuda", 0) == 0 ? o.gpu_half_rows : o.cpu_half_rows;
    std::map<std::string, op_timing> ops;
    for (size_t id = 0; id < from.nodes.size(); ++id) {
      if (from.nodes[id].is_input()) continue;
      const auto it = node.ops.find(op_key(from, static_cast<int>(id)));
      if (it == node.ops.end()) continue;
      const double r0 = op_rows(from, static_cast<int>(id)), r1 = op_rows(to, static_cast<int>(id));
      op_timing t = it->second;
      t.forward_s = rescale_op_seconds(t.forward_s, r0, r1, half);
      t.backward_s = rescale_op_seconds(t.backward_s, r0, r1, half);
      ops[op_key(to, static_cast<int>(id))] = t;  // ops of one key scale alike
    }
    node.ops = std::move(ops);
  }
  return out;
}

micro_batch_choice pick_micro_batches(std::vector<micro_batch_prediction> candidates) {
  if (candidates.empty()) throw std::invalid_argument("pick_micro_batches: no candidate");
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a.micro_batches < b.micro_batches; });
  micro_batch_choice c;
  const micro_batch_prediction* best = nullptr;
  for (const auto& m : candidates)
    if (m.over_memory.empty() && (!best || m.step_s < best->step_s * 0.99)) best = &m;
  char buf[200];
  if (best) {
    c.chosen = best->micro_batches;
    std::snprintf(buf, sizeof buf, "%lld %s: the shortest predicted step (%.4g s under %s)",
                  static_cast<long long>(best->micro_batches), best->micro_batches == 1 ? "micro-batch" : "micro-batches",
                  best->step_s, schedule_name(best->schedule));
    c.reason = buf;
    // What the neighbours lose (the candidates are sorted by M).
    if (best->micro_batches > candidates.front().micro_batches) c.reason += "; fewer leave more of the pipeline idle";
    if (best->micro_batches < candidates.back().micro_batches) c.reason += "; more make every op's GEMMs smaller";
  } else {
    best = &*std::min_element(candidates.begin(), candidates.end(),
                              [](const auto& a, const auto& b) { return a.peak_bytes < b.peak_bytes; });
    c.chosen = best->micro_batches;
    std::snprintf(buf, sizeof buf, "%lld %s: no candidate fits in memory, this one needs the least (%s)",
                  static_cast<long long>(best->micro_batches), best->micro_batches == 1 ? "micro-batch" : "micro-batches",
                  human_bytes(best->peak_bytes).c_str());
    c.reason = buf;
  }
  c.candidates = std::move(candidates);
  return c;
}

std::string format_candidates(const micro_batch_choice& c) {
  std::string out;
  char buf[96];
  for (const auto& m : c.candidates) {
    std::snprintf(buf, sizeof buf, "%sM=%lld %.4g s", out.empty() ? "" : ", ", static_cast<long long>(m.micro_batches),
                  m.step_s);
    out += buf;
    if (!m.over_memory.empty()) out += " (" + m.over_memory + ")";
  }
  return out;
}

micro_batch_choice choose_micro_batches(int64_t batch, const graph& measured_graph, const cluster_spec& c,
                                        const cluster_profile& measured, const graph_at_rows& graph_at,
                                        const plan_for& place, std::optional<pipeline_schedule> fixed,
                                        const estimator_options& eo, const micro_batch_options& o) {
  std::vector<micro_batch_prediction> out;
  std::string first_refusal;
  for (const int64_t m : micro_batch_candidates(batch, o.max_micro_batches)) {
    try {
      const graph g = graph_at(batch / m);
      const cluster_profile prof = rescale_profile(measured, measured_graph, g, static_cast<int>(m), o);
      const workload_estimator est(g, c, prof, eo);
      plan p = place(est, prof);
      // A replica without micro-batches would never send its gradients: the run refuses such a
      // plan (train.micro-batches below the replica count), so it is no candidate.
      for (size_t st = 0; st < p.where.stages.size(); ++st) {
        const auto counts = routed_micro_batches(p.where, static_cast<int>(st));
        if (std::find(counts.begin(), counts.end(), 0) != counts.end())
          throw std::runtime_error("a replica of stage " + std::to_string(st) + " would get no micro-batch");
      }
      p.schedule = fixed ? *fixed : choose_schedule(est, p).chosen;
      const step_estimate e = est.simulate(p);
      micro_batch_prediction r;
      r.micro_batches = m;
      r.step_s = e.step_s;
      r.schedule = p.schedule;
      for (size_t n = 0; n < e.node_memory_bytes.size(); ++n) {
        const double need = e.node_memory_bytes[n];
        r.peak_bytes = std::max(r.peak_bytes, need);
        const uint64_t has = n < prof.nodes.size() ? prof.nodes[n].memory_bytes : 0;
        if (has > 0 && need > static_cast<double>(has) && r.over_memory.empty())
          r.over_memory = "needs " + human_bytes(need) + " on " + c.nodes.at(n).name + ", has " +
                          human_bytes(static_cast<double>(has));
      }
      out.push_back(std::move(r));
    } catch (const std::exception& e) {
      if (first_refusal.empty()) first_refusal = "M=" + std::to_string(m) + ": " + e.what();
    }
  }
  if (out.empty()) throw std::runtime_error("train.micro-batches = auto: no candidate could be planned (" + first_refusal + ")");
  return pick_micro_batches(std::move(out));
}

}  // namespace fusion
