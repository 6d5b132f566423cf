// The AdaTopK rule on synthetic links: slow links get the densest ladder rung whose payload fits
// the compute budget (f32 -> f16 -> int8 -> int4 -> top-k), fast ones stay dense, floors hold
// per direction, an unknown rate means dense, every proposal says why, and the governor ignores
// bandwidth noise but follows a real step change.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "compression/adaptive.hpp"
#include "compression/codec.hpp"

namespace fusion {
namespace {

// One activation tensor of 1 MiB fp32 per micro-batch (64 full blocks of 4096).
constexpr uint64_t edge_elements = 262144;
const std::vector<double> ladder = {1.0,  keep_all_ratio, int8_level, int4_level, 0.5,  0.3, 0.2,
                                   0.15, 0.1,            0.07,       0.05,       0.03, 0.02, 0.01};

// Settings that allow top-k (the defaults allow only the quantized keep-all rung): activations
// down to 10%, gradients down to 20%.
adaptive_settings topk_floors() {
  adaptive_settings s;
  s.floor_activations = 0.1;
  s.floor_gradients = 0.2;
  return s;
}

link_load make_link(bool forward, double mbit, double budget_s, double rtt_s = 0) {
  link_load l;
  l.forward = forward;
  l.elements = {edge_elements};
  l.mbit = mbit;
  l.rtt_s = rtt_s;
  l.budget_s = budget_s;
  return l;
}

// The rate (Mbit/s) at which `ratio` exactly fills the budget of `l` (rtt ignored: tests that
// use it have rtt 0).
double rate_needed(link_load l, double ratio, const adaptive_settings& s) {
  l.mbit = 1;
  return link_seconds(l, ratio, s) / l.budget_s;
}

// A rate half way (geometrically) between where `lo` starts to fit and where the denser `hi`
// does: `lo` is proposed, and noise of a few percent does not reach either boundary.
double rate_between(const link_load& l, double lo, double hi, const adaptive_settings& s) {
  return std::sqrt(rate_needed(l, lo, s) * rate_needed(l, hi, s));
}

// The next denser rung than `r`, or 0 when `r` is 1 or not on the ladder.
double denser_rung(double r) {
  for (size_t i = 1; i < ladder.size(); ++i)
    if (ladder[i] == r) return ladder[i - 1];
  return 0;
}

TEST_CASE("adaptive: link_seconds sums the edges' payloads and adds half the round trip") {
  const adaptive_settings s = topk_floors();
  link_load l = make_link(true, 2, 1, 0.02);
  l.elements = {1000, 3000};
  CHECK(link_seconds(l, 1.0, s) == doctest::Approx(16000 * 8 / 2e6 + 0.01));
  // The top-k rungs send int8 values with a scale per scale_block of them.
  const uint64_t bytes = topk_payload_bytes(1000, 0.1, value_type::int8, s.block, s.scale_block) +
                         topk_payload_bytes(3000, 0.1, value_type::int8, s.block, s.scale_block);
  CHECK(link_seconds(l, 0.1, s) == doctest::Approx(double(bytes) * 8 / 2e6 + 0.01));
  CHECK(link_seconds(l, 0.1, s) < link_seconds(l, 0.5, s));
}

TEST_CASE("adaptive: a slow link gets the densest rung that fits the budget") {
  const adaptive_settings s = topk_floors();
  const link_load l = make_link(true, 8, 0.1, 0.002);
  REQUIRE(link_seconds(l, 1.0, s) > l.budget_s);
  const double r = propose_ratio(l, s);
  INFO("proposed " << r);
  CHECK(r < 1);
  CHECK(r >= s.floor_activations);
  CHECK(link_seconds(l, r, s) <= l.budget_s);
  // The densest: the rung above it does not fit.
  const double up = denser_rung(r);
  REQUIRE(up > 0);
  CHECK(link_seconds(l, up, s) > l.budget_s);
}

TEST_CASE("adaptive: a fast link stays dense") {
  const adaptive_settings s = topk_floors();
  const link_load l = make_link(true, 1000, 0.1, 0.002);
  CHECK(link_seconds(l, 1.0, s) <= l.budget_s);
  CHECK(propose_ratio(l, s) == 1.0);
  link_load g = l;
  g.forward = false;
  CHECK(propose_ratio(g, s) == 1.0);
}

TEST_CASE("adaptive: the defaults stop at int8 (every element kept), a higher gradient floor is respected") {
  {
    const adaptive_settings d;
    link_load slow = make_link(true, 0, 0.05);
    slow.mbit = rate_between(slow, 0.1, 0.15, d);
    CHECK(propose_ratio(slow, d) == int8_level);
    CHECK(link_seconds(slow, int8_level, d) < link_seconds(slow, 1.0, d) * 0.28);  // a byte and a bit per element
    CHECK(link_seconds(slow, keep_all_ratio, d) < link_seconds(slow, 1.0, d) * 0.55);  // f16: about half
    CHECK(keep_count(4096, keep_all_ratio) == 4096);
  }
  const adaptive_settings s = topk_floors();
  CHECK(s.floor_gradients > s.floor_activations);
  // A rate where 0.1 fits but 0.15 does not: activations get 0.1, gradients stop at their floor.
  link_load fwd = make_link(true, 0, 0.05);
  fwd.mbit = rate_between(fwd, 0.1, 0.15, s);
  link_load bwd = fwd;
  bwd.forward = false;
  CHECK(propose_ratio(fwd, s) == 0.1);
  CHECK(propose_ratio(bwd, s) == s.floor_gradients);
  CHECK(link_seconds(bwd, s.floor_gradients, s) > bwd.budget_s);  // the floor wins over the budget
  // Every proposal over a sweep of rates stays at or above its direction's floor.
  for (double mbit = 0.1; mbit < 2000; mbit *= 1.3) {
    fwd.mbit = bwd.mbit = mbit;
    CHECK(propose_ratio(fwd, s) >= s.floor_activations);
    CHECK(propose_ratio(bwd, s) >= s.floor_gradients);
  }
}

TEST_CASE("adaptive: a link too slow even for the floor gets the floor") {
  adaptive_settings s = topk_floors();
  const link_load l = make_link(true, 0.5, 0.1);
  REQUIRE(link_seconds(l, s.floor_activations, s) > l.budget_s);
  CHECK(propose_ratio(l, s) == s.floor_activations);
  link_load g = l;
  g.forward = false;
  CHECK(propose_ratio(g, s) == s.floor_gradients);
  // A floor that is not a rung is returned as it is.
  s.floor_activations = 0.25;
  CHECK(propose_ratio(l, s) == 0.25);
  // ... and a rung above it is still chosen when that fits.
  link_load mid = make_link(true, 0, 0.05);
  mid.mbit = rate_between(mid, int4_level, int8_level, s);
  CHECK(propose_ratio(mid, s) == int4_level);
  // Where int4 does not fit, no top-k rung >= 0.25 does either (all larger than int4): the floor.
  mid.mbit = rate_between(mid, 0.2, int4_level, s);
  CHECK(propose_ratio(mid, s) == 0.25);
}

TEST_CASE("adaptive: an unknown rate keeps the link dense") {
  const adaptive_settings s = topk_floors();
  for (const double mbit : {0.0, -1.0}) {
    link_load l = make_link(true, mbit, 0.001);
    CHECK(propose_ratio(l, s) == 1.0);
    l.forward = false;
    CHECK(propose_ratio(l, s) == 1.0);
    CHECK(std::isinf(link_seconds(l, 0.5, s)));
  }
}

TEST_CASE("adaptive: bandwidth noise of 10% does not move the governed ratio") {
  const adaptive_settings s = topk_floors();
  link_load l = make_link(true, 0, 0.05);
  const double base = rate_between(l, 0.1, 0.15, s);
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  ratio_governor gov;
  int changes = 0;
  for (int i = 0; i < 200; ++i) {
    l.mbit = base * noise(rng);
    const double p = propose_ratio(l, s);
    CHECK(link_seconds(l, p, s) <= l.budget_s);
    if (gov.update(p, s)) {
      ++changes;
      INFO("evaluation " << i);
      CHECK(i == int(s.confirm) - 1);  // the initial adoption, as soon as it is confirmed
    }
  }
  CHECK(changes == 1);
  CHECK(gov.current() == 0.1);
}

TEST_CASE("adaptive: the governor ignores proposals inside the band and interrupted streaks") {
  adaptive_settings s = topk_floors();
  s.band = 0.5;
  ratio_governor gov(0.5);
  for (int i = 0; i < 5; ++i) CHECK_FALSE(gov.update(0.3, s));  // 40% away: inside the band
  CHECK(gov.current() == 0.5);
  s.band = 0.25;
  s.confirm = 2;
  // 0.3, 0.2, 0.3, 0.2, ...: never the same rung twice in a row.
  for (int i = 0; i < 10; ++i) CHECK_FALSE(gov.update(i % 2 == 0 ? 0.3 : 0.2, s));
  // Proposing the current ratio resets a started streak.
  CHECK_FALSE(gov.update(0.5, s));
  CHECK_FALSE(gov.update(0.2, s));
  CHECK_FALSE(gov.update(0.5, s));
  CHECK_FALSE(gov.update(0.2, s));
  CHECK(gov.update(0.2, s));
  CHECK(gov.current() == 0.2);
}

TEST_CASE("adaptive: a real step change in bandwidth is adopted after confirm evaluations") {
  adaptive_settings s = topk_floors();
  s.confirm = 3;
  link_load l = make_link(true, 8, 0.1);
  const double slow = propose_ratio(l, s);
  REQUIRE(slow < 1);
  ratio_governor gov;
  for (uint32_t i = 1; i <= 10; ++i) {
    const bool changed = gov.update(propose_ratio(l, s), s);
    CHECK(changed == (i == s.confirm));
  }
  CHECK(gov.current() == slow);
  l.mbit = 100;  // 8 -> 100 Mbit: dense fits again
  REQUIRE(propose_ratio(l, s) == 1.0);
  for (uint32_t i = 1; i <= 10; ++i) {
    const bool changed = gov.update(propose_ratio(l, s), s);
    CHECK(changed == (i == s.confirm));
    CHECK(gov.current() == (i < s.confirm ? slow : 1.0));
  }
}

TEST_CASE("adaptive: confirm=1 adopts a proposal at once") {
  adaptive_settings s = topk_floors();
  s.confirm = 1;
  link_load l = make_link(false, 8, 0.1);
  ratio_governor gov;
  const double p = propose_ratio(l, s);
  REQUIRE(p < 1);
  CHECK(gov.update(p, s));
  CHECK(gov.current() == p);
  l.mbit = 1000;
  CHECK(gov.update(propose_ratio(l, s), s));
  CHECK(gov.current() == 1.0);
}

TEST_CASE("adaptive: the ladder walks f32, f16, int8, int4, then top-k as the link slows") {
  adaptive_settings s;
  s.floor_activations = 0.01;
  link_load l = make_link(true, 0, 0.05);
  std::vector<double> seen;
  for (double mbit = 2000; mbit > 0.5; mbit /= 1.05) {
    l.mbit = mbit;
    const double r = propose_ratio(l, s);
    if (seen.empty() || seen.back() != r) seen.push_back(r);
  }
  // Never back up the ladder while the rate falls, and every quantizing rung is used.
  for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] < seen[i - 1]);
  REQUIRE(seen.size() >= 6);
  CHECK(seen[0] == 1.0);
  CHECK(seen[1] == keep_all_ratio);
  CHECK(seen[2] == int8_level);
  CHECK(seen[3] == int4_level);
  CHECK(seen[4] == 0.3);  // top-k 50% with int8 values is larger than int4, 30% the first smaller
  CHECK(seen.back() == 0.01);
  // The rungs' codecs: int8 and int4 with the settings' scale block, priced by their payloads.
  s.scale_block = 128;
  const codec_settings q8 = rung_codec(int8_level, s), q4 = rung_codec(int4_level, s);
  CHECK(q8.kind == codec_kind::int8);
  CHECK(q4.kind == codec_kind::int4);
  CHECK(q8.scale_block == 128);
  l.mbit = 8;
  l.elements = {1000, 3000};
  CHECK(link_seconds(l, int8_level, s) ==
        doctest::Approx(double(quant_payload_bytes(1000, 8, 128) + quant_payload_bytes(3000, 8, 128)) * 8 / 8e6));
}

TEST_CASE("adaptive: floors name rungs, per direction") {
  double level = 0;
  CHECK(parse_level("int8", level));
  CHECK(level == int8_level);
  CHECK(parse_level("int4", level));
  CHECK(level == int4_level);
  CHECK(parse_level("f16", level));
  CHECK(level == 1);
  CHECK(parse_level("1.0", level));
  CHECK(level == 1);
  CHECK(parse_level("0.1", level));
  CHECK(level == 0.1);
  for (const char* bad : {"", "0", "-0.5", "1.5", "int2", "0.1x", "nan"}) CHECK_FALSE(parse_level(bad, level));

  adaptive_settings s;  // default floors: int8
  link_load fwd = make_link(true, 0, 0.05);
  fwd.mbit = rate_between(fwd, int4_level, int8_level, s);  // int4 fits, int8 does not
  CHECK(propose_ratio(fwd, s) == int8_level);               // the floor: int4 is opt-in
  s.floor_activations = 1.0;                                // "f16": keep-all only
  CHECK(propose_ratio(fwd, s) == keep_all_ratio);
  s.floor_activations = int4_level;
  s.floor_gradients = int8_level;
  link_load bwd = fwd;
  bwd.forward = false;
  CHECK(propose_ratio(fwd, s) == int4_level);
  CHECK(propose_ratio(bwd, s) == int8_level);  // its floor, although it does not fit
  // Too slow for any rung: each direction stops at its floor, never at top-k.
  fwd.mbit = bwd.mbit = 0.01;
  CHECK(propose_ratio(fwd, s) == int4_level);
  CHECK(propose_ratio(bwd, s) == int8_level);
}

TEST_CASE("adaptive: every proposal says why, in words") {
  adaptive_settings s;
  s.floor_activations = int4_level;
  link_load l = make_link(true, 1000, 0.05);
  rung_choice c = choose_rung(l, s);
  CHECK(c.level == 1.0);
  CHECK(c.reason.find("f32 needs") == 0);
  CHECK(c.reason.find("fits the slowest stage's 50 ms") != std::string::npos);
  l.mbit = rate_between(l, int8_level, keep_all_ratio, s);
  c = choose_rung(l, s);
  CAPTURE(c.reason);
  CHECK(c.level == int8_level);
  CHECK(c.reason.find("int8 /64") != std::string::npos);
  CHECK(c.reason.find(": fits the slowest stage's 50 ms") != std::string::npos);
  l.mbit = 0.01;
  c = choose_rung(l, s);
  CAPTURE(c.reason);
  CHECK(c.level == int4_level);
  CHECK(c.reason.find("even the floor int4 /64 needs") != std::string::npos);
  l.mbit = 0;
  CHECK(choose_rung(l, s).reason.find("not measured") != std::string::npos);
  CHECK(level_name(1.0, s) == "f32");
  CHECK(level_name(keep_all_ratio, s) == "f16 keep-all");
  CHECK(level_name(int8_level, s) == "int8 /64");
  CHECK(level_name(int4_level, s) == "int4 /64");
  CHECK(level_name(0.2, s) == "top-k 20% int8 /64");
}

TEST_CASE("adaptive: a change of codec is never noise for the governor") {
  adaptive_settings s;
  s.band = 0.5;
  s.confirm = 2;
  ratio_governor gov(keep_all_ratio);
  // f16 -> int8: the levels differ by 2^-53, far inside any band, but the codec changes.
  CHECK_FALSE(gov.update(int8_level, s));
  CHECK(gov.update(int8_level, s));
  CHECK(gov.current() == int8_level);
  CHECK_FALSE(gov.update(int4_level, s));
  CHECK(gov.update(int4_level, s));
  // int4 -> top-k 0.15 and back up: changes of codec too.
  CHECK_FALSE(gov.update(0.15, s));
  CHECK(gov.update(0.15, s));
  // Between two top-k ratios the band still holds: 0.15 -> 0.1 is 33%, inside 50%.
  CHECK_FALSE(gov.update(0.1, s));
  CHECK_FALSE(gov.update(0.1, s));
  CHECK(gov.current() == 0.15);
}

}  // namespace
}  // namespace fusion
