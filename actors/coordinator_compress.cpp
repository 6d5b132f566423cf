// Compression of cross-node edges (docs/compression.md): the codec of every edge when the run
// is wired, and AdaTopK's re-evaluation every compression.every steps. The rule itself is pure
// (compression/adaptive.hpp, scheduler/compression_plan.hpp); this file feeds it the refined
// estimator and tells the edge senders (compress_atom), which switch between two tensors: the
// receiver decodes by each tensor's wire header, so no step boundary or handshake is needed.
#include <algorithm>
#include <cstdio>

#include "actors/coordinator_state.hpp"
#include "core/log.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/survivors.hpp"

namespace fusion {

void plan_compression(coord_ptr self) {
  auto& st = self->state;
  const auto& c = st.in->cfg.compression;
  auto usable = usable_nodes(st);
  if (std::find(usable.begin(), usable.end(), false) == usable.end()) {
    st.exec.current = plan_compressed_run(*estimator_of(self), st.exec.profile, c, 1, nullptr, fixed_schedule(st.in->cfg));
  } else {
    // Spares that have not joined get nothing: the policy places the model on the others.
    cluster_profile profile = st.exec.profile;
    profile.micro_batches = static_cast<int>(st.in->cfg.micro_batches);
    st.exec.current = make_plan(st.in->model,
                                place_on_survivors(st.in->model, st.in->cluster, profile, usable, c,
                                                   fixed_schedule(st.in->cfg)).where,
                                1);
    assign_codecs(st.exec.current, estimator_of(self), c);
  }
  st.exec.governors.clear();
  if (!codec_of(c.mode).adaptive()) return;
  // The governors start from the ratios the profile gave, so the first re-evaluation measures
  // against what runs.
  for (auto& g : link_groups(st.exec.current, *estimator_of(self))) {
    const double r = st.exec.current.edges[g.edges.front()].setting.keep_ratio;
    st.exec.governors.emplace(std::make_tuple(g.from, g.to, g.load.forward), ratio_governor(r));
  }
}

void adapt_compression(coord_ptr self) {
  auto& st = self->state;
  const auto& c = st.in->cfg.compression;
  auto* est = estimator_of(self);
  // The estimator learns from step 3 on (observe_step), so the first evaluation waits for it.
  if (!codec_of(c.mode).adaptive() || !est || st.train.step < 3 || st.train.step % c.every != 0) return;
  for (auto& g : link_groups(st.exec.current, *est)) {
    auto key = std::make_tuple(g.from, g.to, g.load.forward);
    auto it = st.exec.governors.find(key);
    if (it == st.exec.governors.end()) it = st.exec.governors.emplace(key, ratio_governor(1.0)).first;
    const double before = it->second.current();
    const rung_choice proposed = choose_rung(g.load, c.adaptive);
    if (!it->second.update(proposed.level, c.adaptive)) continue;
    const double after = it->second.current();
    uint64_t dense = 0;
    for (size_t i : g.edges) {
      auto& e = st.exec.current.edges[i];
      if (st.exec.pinned_edges.count(e.id)) continue;  // the admin's choice stands
      e.setting = codec_for_edge(e, c, {after, std::nullopt});
      dense += e.bytes_per_micro_batch;
      if (auto s = st.exec.senders.find(e.id); s != st.exec.senders.end()) self->send(s->second, compress_atom::value, e.setting);
    }
    const std::string link = link_group_name(st.in->cluster, g);
    char why[256];
    std::snprintf(why, sizeof why, "link %.1f Mbit/s, %s per micro-batch dense: %s now, %s at the new rung; "
                  "slowest stage %s",
                  g.load.mbit, human_bytes(static_cast<double>(dense)).c_str(),
                  seconds_text(link_seconds(g.load, before, c.adaptive)).c_str(),
                  seconds_text(link_seconds(g.load, after, c.adaptive)).c_str(), seconds_text(g.load.budget_s).c_str());
    if (st.in->cfg.progress)
      std::fprintf(stderr, "fusion-train: step %lld: %s sends %s (was %s): %s (%s)\n",
                   static_cast<long long>(st.train.step), link.c_str(), level_name(after, c.adaptive).c_str(),
                   level_name(before, c.adaptive).c_str(), why, proposed.reason.c_str());
    if (st.train.metrics.is_open())
      st.train.metrics << compression_metrics_line({st.train.step, link, before, after, g.load.mbit, dense,
                                                    g.load.budget_s, level_name(before, c.adaptive),
                                                    level_name(after, c.adaptive), proposed.reason})
                 << '\n' << std::flush;
  }
}

}  // namespace fusion
