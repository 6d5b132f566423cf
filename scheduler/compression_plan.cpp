#include "scheduler/compression_plan.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace fusion {

codec_settings codec_for_edge(const plan_edge& e, const compression_config& c, const edge_codec_state& st) {
  if (e.kind == edge_kind::reduce) {
    if (c.allreduce != value_type::f16) return {};
    codec_settings f16;
    f16.kind = codec_kind::topk;
    f16.keep_ratio = keep_all_ratio;
    f16.values = value_type::f16;
    f16.block = c.adaptive.block;
    return f16;
  }
  if (!e.compressible) return {};
  codec_settings run;
  run.values = c.adaptive.values;
  run.block = c.adaptive.block;
  run.scale_block = c.adaptive.scale_block;
  run.error_feedback = c.error_feedback && e.kind == edge_kind::backward;
  if (st.pinned) return codec_of(st.pinned->kind).at(st.pinned->ratio, run);
  const codec& mode = codec_of(c.mode);
  return mode.at(mode.adaptive() ? st.link_ratio.value_or(1.0) : c.ratio, run);
}

std::vector<link_group> link_groups(const plan& p, const workload_estimator& est) {
  const int nodes = static_cast<int>(est.cluster().nodes.size());
  // The pipeline's pace per phase: the slowest node's compute per micro-batch.
  const auto [fwd, bwd] = est.node_phase_s(p);
  const double fwd_budget = nodes ? *std::max_element(fwd.begin(), fwd.end()) : 0;
  const double bwd_budget = nodes ? *std::max_element(bwd.begin(), bwd.end()) : 0;
  std::map<std::tuple<int, int, bool>, link_group> groups;
  for (size_t i = 0; i < p.edges.size(); ++i) {
    const plan_edge& e = p.edges[i];
    if (!e.compressible || e.kind == edge_kind::reduce || e.bytes_per_micro_batch == 0 || e.from < 0 || e.to < 0 ||
        e.from >= nodes || e.to >= nodes)
      continue;
    auto& g = groups[{e.from, e.to, e.forward()}];
    g.from = e.from;
    g.to = e.to;
    g.edges.push_back(i);
    g.load.forward = e.forward();
    g.load.elements.push_back(e.bytes_per_micro_batch / sizeof(float));
    g.load.mbit = est.link_mbit(e.from, e.to);
    g.load.rtt_s = est.link_rtt_s(e.from, e.to);
    g.load.budget_s = e.forward() ? fwd_budget : bwd_budget;
  }
  std::vector<link_group> out;
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  return out;
}

void assign_codecs(plan& p, const workload_estimator* est, const compression_config& c) {
  p.allreduce_every = std::max<int64_t>(1, c.allreduce_every);
  // The all-reduce's format is its own setting, whatever the activations' codec.
  for (auto& e : p.edges) e.setting = e.kind == edge_kind::reduce ? codec_for_edge(e, c) : codec_settings{};
  if (c.mode == codec_kind::none) return;
  if (!codec_of(c.mode).adaptive() || !est) {
    // Without an estimator (a one-process run has no links) adatopk starts dense.
    for (auto& e : p.edges) e.setting = codec_for_edge(e, c);
    return;
  }
  for (auto& g : link_groups(p, *est)) {
    const edge_codec_state link{propose_ratio(g.load, c.adaptive), std::nullopt};
    for (size_t i : g.edges) p.edges[i].setting = codec_for_edge(p.edges[i], c, link);
  }
}

double cut_bytes_ratio(const compression_config& c) {
  if (c.mode == codec_kind::none) return 1.0;
  codec_settings run;
  run.values = c.adaptive.values;
  run.block = c.adaptive.block;
  run.scale_block = c.adaptive.scale_block;
  const codec& mode = codec_of(c.mode);
  std::vector<codec_settings> settings;
  if (mode.adaptive()) {
    for (bool forward : {true, false}) settings.push_back(rung_codec(floor_level(forward, c.adaptive), c.adaptive));
  } else {
    settings.push_back(mode.at(c.ratio, run));
  }
  // A tensor of a typical activation's size; the ratio hardly depends on it (block headers).
  constexpr uint64_t n = uint64_t{1} << 16;
  double ratio = 0;
  for (auto& s : settings) {
    const double bytes = s.kind == codec_kind::none ? 4.0 * n : static_cast<double>(codec_of(s.kind).wire_bytes(n, s));
    ratio = std::max(ratio, bytes / (4.0 * n));
  }
  return std::clamp(ratio, 1e-6, 1.0);
}

double allreduce_bytes_ratio(const compression_config& c) {
  if (c.allreduce == value_type::f32) return 1.0;
  plan_edge hop;
  hop.kind = edge_kind::reduce;
  hop.compressible = true;
  const codec_settings s = codec_for_edge(hop, c);
  if (s.kind == codec_kind::none) return 1.0;
  constexpr uint64_t n = uint64_t{1} << 16;
  return static_cast<double>(codec_of(s.kind).wire_bytes(n, s)) / (4.0 * n);
}

plan plan_compressed_run(const workload_estimator& est, const cluster_profile& profile, const compression_config& c,
                         uint64_t first_id, opfence_report* report, std::optional<pipeline_schedule> schedule) {
  const graph& g = est.model();
  const cluster_spec& cluster = est.cluster();
  plan p;
  if (is_opfence(cluster.placement.policy)) {
    opfence_options o;
    o.replicas = cluster.placement.policy == placement_policy::opfence_replicas;
    o.schedule = schedule;
    if (c.mode != codec_kind::none || c.allreduce != value_type::f32 || c.allreduce_every > 1)
      o.prepare_plan = [&](plan& candidate) { assign_codecs(candidate, &est, c); };
    o.cut_bytes_ratio = cut_bytes_ratio(c);
    o.allreduce_bytes_ratio = allreduce_bytes_ratio(c);
    o.allreduce_every = std::max<int64_t>(1, c.allreduce_every);
    p = make_plan(g, opfence_place(est, o, report), first_id);
  } else {
    p = plan_run(g, cluster, profile, first_id);
  }
  assign_codecs(p, &est, c);
  return p;
}

std::string link_group_name(const cluster_spec& c, const link_group& g) {
  auto name = [&](int k) {
    return k >= 0 && k < static_cast<int>(c.nodes.size()) ? c.nodes[k].name : "node #" + std::to_string(k);
  };
  return name(g.from) + " -> " + name(g.to) + (g.load.forward ? " fwd" : " bwd");
}

}  // namespace fusion
