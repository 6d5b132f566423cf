// The AdaTopK rule (compression/adaptive.hpp): link time per keep ratio, the ladder search and
// the hysteresis of ratio_governor.
#include "compression/adaptive.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace fusion {

namespace {

// Densest first: propose_ratio takes the first rung that fits.
constexpr std::array<double, 11> ratio_ladder = {keep_all_ratio, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01};

// The direction's floor as a usable keep ratio: encode_topk takes (0, 1], so a floor >= 1 means
// "never compress" and a non-positive (or NaN) floor falls back to the lowest rung rather than
// proposing a ratio no encoder accepts.
double floor_of(const link_load& load, const adaptive_settings& s) {
  const double f = load.forward ? s.floor_activations : s.floor_gradients;
  if (!(f > 0)) return ratio_ladder.back();
  // A floor of 1 forbids top-k, not quantization: the densest lossy rung stays allowed.
  return f >= keep_all_ratio ? keep_all_ratio : f;
}

}  // namespace

codec_settings rung_codec(double ratio, const adaptive_settings& s) {
  if (ratio >= 1) return {};  // the link keeps up: raw fp32
  codec_settings run;
  run.values = s.values;
  run.block = s.block;
  return codec_of(codec_kind::adatopk).at(ratio, run);
}

double link_seconds(const link_load& load, double ratio, const adaptive_settings& s) {
  // An unknown rate gives an unknown time: infinity, so nobody mistakes it for a fast link.
  if (!(load.mbit > 0)) return std::numeric_limits<double>::infinity();
  const codec_settings rung = rung_codec(ratio, s);
  const codec& c = codec_of(rung.kind);
  uint64_t bytes = 0;
  for (const uint64_t n : load.elements) bytes += c.payload_bytes(n, rung);
  return static_cast<double>(bytes) * 8.0 / (load.mbit * 1e6) + load.rtt_s / 2;
}

double propose_ratio(const link_load& load, const adaptive_settings& s) {
  if (!(load.mbit > 0)) return 1.0;
  if (link_seconds(load, 1.0, s) <= load.budget_s) return 1.0;
  const double floor = floor_of(load, s);
  // Payloads grow with the ratio, so the first (densest) rung that fits is the answer.
  for (const double rung : ratio_ladder) {
    if (rung < floor) break;
    if (link_seconds(load, rung, s) <= load.budget_s) return rung;
  }
  return floor;
}

bool ratio_governor::update(double proposed, const adaptive_settings& s) {
  auto reset = [this] {
    pending_ = 0;
    streak_ = 0;
  };
  if (proposed == current_) {
    reset();
    return false;
  }
  // A current ratio of 0 or less never comes from the rule; treat any proposal as a real change
  // instead of dividing by it.
  // Between exact (raw fp32) and lossy is a change of kind, never noise: the band does not apply.
  const bool changes_kind = (current_ >= 1) != (proposed >= 1);
  if (!changes_kind && current_ > 0 && std::abs(proposed - current_) / current_ <= s.band) {
    reset();
    return false;
  }
  if (proposed == pending_) {
    ++streak_;
  } else {
    pending_ = proposed;
    streak_ = 1;
  }
  // confirm 0 would mean "adopt before it was proposed": the same as 1.
  if (streak_ >= std::max<uint32_t>(s.confirm, 1)) {
    current_ = proposed;
    reset();
    return true;
  }
  return false;
}

}  // namespace fusion
