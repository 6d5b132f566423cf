// The AdaTopK rule: which keep ratio each direction of each cross-node link gets. Plain C++,
// tested on synthetic numbers (tests/compression/adaptive_test.cpp); the coordinator feeds it
// measured link rates and the estimator's stage times (actors/coordinator_compress.cpp).
//
// A pipeline step runs as fast as its slowest stage. A link direction is a stage too: its time
// per micro-batch is payload / rate + rtt / 2. When that exceeds the slowest compute stage of
// the same phase (forward compute for activations, backward compute for gradients), the link is
// the bottleneck: it gets the largest keep ratio whose payload fits the compute time (exact
// payload sizes from the codec table, rung_codec), never below the phase's floor. Links that
// fit stay dense (ratio 1). Edges sharing a link direction share its rate, so the rule works
// per link direction over the sum of their payloads.
//
// The ladder, densest first: raw fp32 (level 1); keep-all (every element kept, values sent as
// `values`: f16 halves the bytes and is nearly exact, level keep_all_ratio); int8 and int4 (a
// code per element and an f32 scale per scale_block elements: about 1/4 and 1/7 of the bytes,
// levels int8_level and int4_level of compression/quant.hpp); then top-k at 0.5, 0.3, 0.2, 0.15,
// 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, the kept values sent as int8 with an f32 scale per
// scale_block of them (compression/topk.hpp). A rung is named by its *level*, one double that orders the
// rungs (a larger level is the denser rung) and is what the governor holds, codec_for_edge
// turns into a codec (adatopk's codec at that level) and the plan and metrics carry as the
// edge's keep_ratio. The rule takes the densest rung whose payload fits, never below the
// direction's floor (a level too: "f16" = 1, "int8", "int4" or a top-k ratio). Noise:
// ratio_governor changes a link's level only after the same new rung was proposed `confirm`
// evaluations in a row and, between two top-k rungs, the proposal is more than `band` away from
// the current ratio, relatively (a change of codec, e.g. f16 -> int8 or int4 -> top-k, always
// counts).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.hpp"
#include "compression/quant.hpp"  // int8_level, int4_level
#include "compression/topk.hpp"   // keep_all_ratio, the densest lossy rung

namespace fusion {

/// Settings of the adaptive rule ([compression] in the run config).
struct adaptive_settings {
  /// Lowest level of a forward (activation) / backward (gradient) link (parse_level): 1 allows
  /// only the f16 keep-all rung, int8_level / int4_level the quantizing rungs too, a ratio below 1
  /// top-k down to it. Default int8 from bench/compression_bench.sh (bench/RESULTS.md sections 8
  /// and 26): over 600 steps of gpt-char-small int8 on both directions ended 0.06% below dense in
  /// validation loss and int4 1.3% above, while even top-50% cost 6%; int4 and top-k are opt-in.
  double floor_activations = int8_level;
  double floor_gradients = int8_level;
  double band = 0.25;               ///< relative change below which a ratio stays put
  uint32_t confirm = 2;             ///< evaluations in a row that must agree before a change
  value_type values = value_type::f16;
  uint32_t block = 4096;
  uint32_t scale_block = quant_default_block;  ///< int8 / int4 rungs: elements per scale
};

/// Parses a floor: "f16" or a number in (0, 1] (1: keep-all, below: a top-k ratio), "int8" or
/// "int4" (their levels). False for anything else.
bool parse_level(std::string_view text, double& level);
/// A level in words: "f32" (raw), "f16 keep-all", "int8 /64", "int4 /64", "top-k 20% int8 /64".
std::string level_name(double level, const adaptive_settings& s);

/// One direction of one link, as the rule sees it.
struct link_load {
  bool forward = true;               ///< carries activations (true) or gradients (false)
  std::vector<uint64_t> elements;    ///< floats per micro-batch of each edge on it
  double mbit = 0;                   ///< measured rate of this direction, Mbit/s (<= 0: unknown)
  double rtt_s = 0;                  ///< round trip, seconds
  double budget_s = 0;               ///< slowest compute stage of this phase, per micro-batch
};

/// The most compressed rung level a direction may reach (activations: forward): its floor as a
/// level the ladder can use.
double floor_level(bool forward, const adaptive_settings& s);

/// The codec of ladder rung `ratio`: none (raw fp32) at 1, else adatopk at that level with the
/// settings' value type and blocks (int8 or int4 at their levels; top-k with int8 values).
codec_settings rung_codec(double ratio, const adaptive_settings& s);

/// Seconds one micro-batch of `load` takes on its link at keep ratio `ratio` (1: dense fp32).
double link_seconds(const link_load& load, double ratio, const adaptive_settings& s);

/// The rule's proposal for one link direction and why, in words for the run's log.
struct rung_choice {
  double level = 1;
  std::string reason;  ///< "f32 needs 0.31 s per micro-batch, int8 /64 0.08 s: fits the slowest stage's 0.1 s"
};

/// The level the rule proposes for `load`: 1 when the dense transfer fits the budget (or the
/// rate is unknown); else the densest ladder rung whose transfer fits, not below the floor of
/// the load's direction (the floor itself when even the floor does not fit).
rung_choice choose_rung(const link_load& load, const adaptive_settings& s);
/// choose_rung's level.
double propose_ratio(const link_load& load, const adaptive_settings& s);

/// Hysteresis for one link direction: holds the current ratio and decides when a proposal is
/// adopted.
class ratio_governor {
 public:
  explicit ratio_governor(double initial = 1.0) : current_(initial) {}
  double current() const { return current_; }
  /// Feeds one evaluation's proposal; returns true when the current ratio changed.
  bool update(double proposed, const adaptive_settings& s);

 private:
  double current_;
  double pending_ = 0;    // the rung proposed in the last evaluations, 0: none
  uint32_t streak_ = 0;   // how many evaluations in a row proposed pending_
};

}  // namespace fusion
