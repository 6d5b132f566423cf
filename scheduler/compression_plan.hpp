// Which codec every cross-node edge of a plan gets ([compression] of the run config,
// docs/compression.md): none, a fixed top-k ratio, or AdaTopK, whose ratios come from the
// workload estimator (link rates, stage times) through the rule of compression/adaptive.hpp.
// Plain C++, tested without actors (tests/scheduler/compression_plan_test.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compression/adaptive.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

/// Compression settings of a run.
struct compression_config {
  codec_kind mode = codec_kind::none;  ///< none, topk (fixed ratio), adatopk, int8 or int4
  double ratio = 0.1;                  ///< topk: keep ratio of every compressed edge
  bool error_feedback = false;         ///< gradient directions keep a residual (off: measured no gain)
  int64_t every = 10;                  ///< adatopk: re-evaluate every N steps
  adaptive_settings adaptive;          ///< floors, hysteresis, value type, blocks
  /// Stage replicas' gradient all-reduce (train.allreduce): f32 (raw) or f16 (the ring's edges
  /// carry f16 values through the topk codec at keep_all_ratio; the ring rounds what it sends, so
  /// every replica applies the same decoded sum: core/ring_reduce.hpp). bf16 is refused.
  value_type allreduce = value_type::f32;
  /// Steps per all-reduce: 1 under train.sync=step, H under local:H (the replicas average their
  /// parameter change once every H steps), so its bytes and time per step are 1/H
  /// (opfence_options::allreduce_every, the estimator's simulation through plan::allreduce_every).
  int64_t allreduce_every = 1;
};

/// The admin's codec for one edge (fusion-admin `compress EDGE none|RATIO`).
struct pinned_codec {
  codec_kind kind = codec_kind::none;  ///< none, or the codec run at `ratio` (RATIO: topk)
  double ratio = 1;
};

/// What, besides the run's settings, decides the codec of one edge direction.
struct edge_codec_state {
  /// An adaptive codec (adatopk): the ratio of the edge's link direction, from its governor or
  /// the rule's proposal at planning; empty when the link has none yet (it starts dense).
  std::optional<double> link_ratio;
  /// The admin's choice; it outranks the run's settings (empty: none, or handed back by `auto`).
  std::optional<pinned_codec> pinned;
};

/// The codec of plan edge `e` under the run's settings `c`: the one decision that planning
/// (assign_codecs), AdaTopK's re-evaluation, migration and the admin's `compress` all make.
/// none for an edge that is not compressible (token ids) and when c.mode is none; else the
/// codec of c.mode at c.ratio, or at st.link_ratio (1 when empty) for an adaptive codec, with
/// the run's value type and block and error feedback on gradient directions. A gradient ring
/// hop (edge_kind::reduce) gets c.allreduce only: none for f32, keep-all f16 for f16.
codec_settings codec_for_edge(const plan_edge& e, const compression_config& c, const edge_codec_state& st = {});

/// One direction of one node pair that carries compressible edges, with its load.
struct link_group {
  int from = -1, to = -1;        ///< cluster node indices
  std::vector<size_t> edges;     ///< indices into plan::edges
  link_load load;                ///< elements per edge, rate, RTT, budget
};

/// The compressible edges of `p` grouped by (from, to, direction), each group's rate and RTT
/// from the estimator and its budget: the slowest node's forward (activations) or backward
/// (gradients) compute per micro-batch under `p`.
std::vector<link_group> link_groups(const plan& p, const workload_estimator& est);

/// Sets p.allreduce_every to c.allreduce_every and the codec of every edge of `p` for `c.mode`: none everywhere; topk at c.ratio on every
/// compressible edge; adatopk at the ratio propose_ratio gives each link group (with `est`
/// from the profile, before the first step). Non-compressible edges (token ids) stay none.
void assign_codecs(plan& p, const workload_estimator* est, const compression_config& c);

/// The fraction of its dense fp32 bytes a compressible edge carries at most compression under
/// `c` (OP-Fence's compression-aware DP, opfence_options::cut_bytes_ratio): 1 for none; the
/// codec's wire bytes per fp32 byte for a fixed codec; for an adaptive one, the rung of its
/// floors, the denser of the two directions (a link carries both).
double cut_bytes_ratio(const compression_config& c);

/// The fraction of the fp32 gradient bytes a ring hop of the all-reduce carries under
/// c.allreduce (1 for f32; the f16 keep-all codec's wire bytes per fp32 byte for f16). Per
/// step it runs once every c.allreduce_every steps (opfence_options::allreduce_every).
double allreduce_bytes_ratio(const compression_config& c);

/// The plan of a run with compression: placed by the cluster file's policy (as plan_run), codecs
/// assigned by assign_codecs. Under OP-Fence with a codec, the cut DP also prices links at
/// cut_bytes_ratio(c) and every candidate plan is simulated with the codecs it would get, so a
/// slow link that compression makes cheap can carry a stage boundary. `est` is built from the run's profile; `report` receives OP-Fence's decision.
/// OP-Fence judges its candidates under `schedule` (the run's train.schedule, or the schedule a
/// running plan keeps), or under each one's fastest when empty (train.schedule=auto).
plan plan_compressed_run(const workload_estimator& est, const cluster_profile& profile, const compression_config& c,
                         uint64_t first_id = 1, opfence_report* report = nullptr,
                         std::optional<pipeline_schedule> schedule = std::nullopt);

/// "a1 -> b1 fwd" for a link group.
std::string link_group_name(const cluster_spec& c, const link_group& g);

}  // namespace fusion
