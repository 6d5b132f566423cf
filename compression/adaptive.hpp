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
// The ladder, densest first: keep_all_ratio (every element kept, values sent as `values`:
// f16 halves the bytes and is nearly exact), then 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03,
// 0.02, 0.01 (top-k). The rule takes the densest rung whose payload fits. Noise: ratio_governor
// changes a link's ratio only after the same new rung was proposed `confirm` evaluations in a
// row and the proposal is more than `band` away from the current ratio, relatively (a change
// between raw fp32 and any lossy rung always counts).
#pragma once

#include <cstdint>
#include <vector>

#include "compression/codec.hpp"
#include "compression/topk.hpp"  // keep_all_ratio, the densest lossy rung

namespace fusion {

/// Settings of the adaptive rule ([compression] in the run config).
struct adaptive_settings {
  /// Lowest keep ratio of a forward (activation) / backward (gradient) link; 1 allows only the
  /// quantized keep-all rung. Default 1 from bench/compression_bench.sh (bench/RESULTS.md
  /// section 8): on gpt-char-small's residual stream even top-50% cost 6% in validation loss.
  double floor_activations = 1.0;
  double floor_gradients = 1.0;
  double band = 0.25;               ///< relative change below which a ratio stays put
  uint32_t confirm = 2;             ///< evaluations in a row that must agree before a change
  value_type values = value_type::f16;
  uint32_t block = 4096;
};

/// One direction of one link, as the rule sees it.
struct link_load {
  bool forward = true;               ///< carries activations (true) or gradients (false)
  std::vector<uint64_t> elements;    ///< floats per micro-batch of each edge on it
  double mbit = 0;                   ///< measured rate of this direction, Mbit/s (<= 0: unknown)
  double rtt_s = 0;                  ///< round trip, seconds
  double budget_s = 0;               ///< slowest compute stage of this phase, per micro-batch
};

/// The codec of ladder rung `ratio`: none (raw fp32) at 1, else adatopk at that ratio with the
/// settings' value type and block.
codec_settings rung_codec(double ratio, const adaptive_settings& s);

/// Seconds one micro-batch of `load` takes on its link at keep ratio `ratio` (1: dense fp32).
double link_seconds(const link_load& load, double ratio, const adaptive_settings& s);

/// The ratio the rule proposes for `load`: 1 when the dense transfer fits the budget (or the
/// rate is unknown); else the densest ladder rung whose transfer fits, not below the floor of
/// the load's direction (the floor itself when even the floor does not fit).
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
