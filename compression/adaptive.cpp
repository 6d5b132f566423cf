// The AdaTopK rule (compression/adaptive.hpp): link time per level, the ladder search with its
// reason, the floors' names and the hysteresis of ratio_governor.
#include "compression/adaptive.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace fusion {

namespace {

// Densest first: choose_rung takes the first rung that fits. The top-k rungs send int8 values;
// at 0.5 that is still larger than int4, so it only serves floors between them.
constexpr std::array<double, 13> ratio_ladder = {keep_all_ratio, int8_level, int4_level, 0.5, 0.3, 0.2, 0.15,
                                                 0.1,            0.07,       0.05,       0.03, 0.02, 0.01};

// Which codec a level is: raw, keep-all, int8, int4 or top-k (a change between two of them is
// never noise).
enum class rung_family { raw, keep_all, int8, int4, topk };
rung_family family_of(double level) {
  if (level >= 1) return rung_family::raw;
  if (level >= keep_all_ratio) return rung_family::keep_all;
  if (level >= int8_level) return rung_family::int8;
  if (level >= int4_level) return rung_family::int4;
  return rung_family::topk;
}

std::string seconds_words(double s) {
  char buf[32];
  if (std::isinf(s)) return "forever";
  std::snprintf(buf, sizeof buf, s < 0.1 ? "%.3g ms" : "%.3g s", s < 0.1 ? s * 1e3 : s);
  return buf;
}

double floor_of(const link_load& load, const adaptive_settings& s) { return floor_level(load.forward, s); }

}  // namespace

// encode_topk takes (0, 1], so a floor >= 1 means "never top-k" and a non-positive (or NaN)
// floor falls back to the lowest rung rather than proposing a ratio no encoder accepts.
double floor_level(bool forward, const adaptive_settings& s) {
  const double f = forward ? s.floor_activations : s.floor_gradients;
  if (!(f > 0)) return ratio_ladder.back();
  // A floor of 1 forbids top-k, not quantization: the densest lossy rung stays allowed.
  return f >= keep_all_ratio ? keep_all_ratio : f;
}

bool parse_level(std::string_view text, double& level) {
  if (text == "f16") return level = 1, true;
  if (text == "int8") return level = int8_level, true;
  if (text == "int4") return level = int4_level, true;
  const std::string t(text);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || !(v > 0 && v <= 1)) return false;
  level = v;
  return true;
}

std::string level_name(double level, const adaptive_settings& s) {
  switch (family_of(level)) {
    case rung_family::raw: return "f32";
    case rung_family::keep_all: return to_string(s.values) + " keep-all";
    case rung_family::int8: return "int8 /" + std::to_string(s.scale_block);
    case rung_family::int4: return "int4 /" + std::to_string(s.scale_block);
    case rung_family::topk: break;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "top-k %.3g%% int8 /%u", level * 100, s.scale_block);
  return buf;
}

codec_settings rung_codec(double ratio, const adaptive_settings& s) {
  if (ratio >= 1) return {};  // the link keeps up: raw fp32
  codec_settings run;
  run.values = s.values;
  run.block = s.block;
  run.scale_block = s.scale_block;
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

rung_choice choose_rung(const link_load& load, const adaptive_settings& s) {
  if (!(load.mbit > 0)) return {1.0, "the link's rate is not measured yet: f32"};
  const double dense = link_seconds(load, 1.0, s);
  const std::string budget = "the slowest stage's " + seconds_words(load.budget_s);
  if (dense <= load.budget_s) return {1.0, "f32 needs " + seconds_words(dense) + " per micro-batch: fits " + budget};
  const std::string head = "f32 needs " + seconds_words(dense) + " per micro-batch, ";
  const double floor = floor_of(load, s);
  // Payloads shrink down the ladder (but for top-k rungs above int4, which then do not fit
  // either), so the first rung that fits is the densest.
  for (const double rung : ratio_ladder) {
    if (rung < floor) break;
    const double t = link_seconds(load, rung, s);
    if (t <= load.budget_s) return {rung, head + level_name(rung, s) + " " + seconds_words(t) + ": fits " + budget};
  }
  return {floor, head + "even the floor " + level_name(floor, s) + " needs " +
                     seconds_words(link_seconds(load, floor, s)) + ", more than " + budget};
}

double propose_ratio(const link_load& load, const adaptive_settings& s) { return choose_rung(load, s).level; }

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
  // A change of codec (raw fp32, keep-all, int8, int4, top-k) is never noise: the band only
  // applies between two top-k ratios.
  const bool changes_kind = family_of(current_) != family_of(proposed);
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
