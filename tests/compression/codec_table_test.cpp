// The codec table (compression/codec.hpp, compression/codec_list.hpp): every codec, through the
// interface only, so a codec added to the table is covered without touching this file. Each
// codec's examples() must encode to exactly payload_bytes, decode back within error_bound, be
// refused when truncated, and agree with the wire's view of it (codec_on_wire, payload_limits).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/codec.hpp"
#include "compression/quant.hpp"  // int4_level

namespace fusion {
namespace {

std::vector<float> normal_data(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

double relative_error(const std::vector<float>& x, const std::vector<float>& y) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    norm += double{x[i]} * x[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Sizes around the interesting boundaries of block-based codecs (empty, one, a block and one
// more, several blocks and a tail).
const std::vector<size_t> sizes = {0, 1, 6, 7, 8, 100, 4096, 4097, 10000};

}  // namespace

TEST_CASE("codec table: one codec per kind, found by kind and by name") {
  REQUIRE(!all_codecs().empty());
  std::set<int> kinds;
  for (const codec* c : all_codecs()) {
    INFO(c->name());
    CHECK(kinds.insert(static_cast<int>(c->kind())).second);
    CHECK(&codec_of(c->kind()) == c);
    codec_kind parsed{};
    CHECK(parse_codec_kind(c->name(), parsed));
    CHECK(parsed == c->kind());
    CHECK(codec_names().find(c->name()) != std::string::npos);
    // What a sender puts in the wire header is what a receiver decodes with.
    const codec* on_wire = codec_on_wire(static_cast<uint32_t>(c->wire_encoding()));
    REQUIRE(on_wire != nullptr);
    CHECK(on_wire->wire_encoding() == on_wire->kind());
    CHECK(!c->examples().empty());
  }
  CHECK(codec_of(codec_kind::none).kind() == codec_kind::none);  // raw is always there
  CHECK_THROWS_AS(codec_of(static_cast<codec_kind>(200)), std::invalid_argument);
  CHECK(codec_on_wire(200) == nullptr);
  codec_kind k{};
  CHECK_FALSE(parse_codec_kind("gzip", k));
}

TEST_CASE("codec table: the names of usage messages and of the wire's refusals") {
  CHECK(codec_names() == "none, topk, adatopk, int8 or int4");
  CHECK(value_type_names() == "f32, f16, bf16 or int8");
  CHECK(wire_encoding_names() == "0 raw, 1 topk, 3 int8, 4 int4");  // adatopk travels as topk
  CHECK(codec_on_wire(static_cast<uint32_t>(codec_kind::adatopk)) == nullptr);
}

TEST_CASE("codec table: every codec's payload has exactly the bytes it predicts") {
  for (const codec* c : all_codecs())
    for (const codec_settings& s : c->examples())
      for (const size_t n : sizes) {
        INFO(c->describe(s), " block ", s.block, ", n ", n);
        const auto x = normal_data(n, static_cast<uint32_t>(n) + 1);
        std::vector<std::byte> payload;
        c->encode(x, s, payload);
        CHECK(payload.size() == c->payload_bytes(n, s));
        const payload_range limits = c->payload_limits(n);
        CHECK(payload.size() >= limits.min);
        CHECK(payload.size() <= limits.max);
        // Sent encoded only when that saves bytes; otherwise the raw fp32 bytes travel.
        if (c->encodes(n, s)) CHECK(payload.size() < 4 * n);
        CHECK(c->wire_bytes(n, s) == (c->encodes(n, s) ? payload.size() : 4 * n));
      }
}

TEST_CASE("codec table: every codec decodes its own payload within its error bound") {
  for (const codec* c : all_codecs())
    for (const codec_settings& s : c->examples())
      for (const size_t n : sizes) {
        INFO(c->describe(s), " block ", s.block, ", n ", n);
        const auto x = normal_data(n, static_cast<uint32_t>(3 * n) + 7);
        std::vector<std::byte> payload;
        c->encode(x, s, payload);
        std::vector<float> back(n, 42.0f);
        const codec* receiver = codec_on_wire(static_cast<uint32_t>(c->wire_encoding()));
        REQUIRE(receiver != nullptr);
        REQUIRE(receiver->decode(payload, back).ok());
        CHECK(relative_error(x, back) <= c->error_bound(s));
        if (c->error_bound(s) == 0) CHECK(back == x);
      }
}

TEST_CASE("codec table: every codec refuses a damaged payload and leaves the tensor alone") {
  for (const codec* c : all_codecs())
    for (const codec_settings& s : c->examples()) {
      INFO(c->describe(s), " block ", s.block);
      const size_t n = 1000;
      const auto x = normal_data(n, 11);
      std::vector<std::byte> payload;
      c->encode(x, s, payload);
      REQUIRE(!payload.empty());
      std::vector<float> dst(n, 42.0f);
      // Truncated, and one byte too long: never silently accepted.
      CHECK_FALSE(c->decode(std::span<const std::byte>(payload.data(), payload.size() - 1), dst).ok());
      payload.push_back(std::byte{0});
      CHECK_FALSE(c->decode(payload, dst).ok());
      payload.pop_back();
      // A destination of another size.
      std::vector<float> small(n - 1, 42.0f);
      CHECK_FALSE(c->decode(payload, small).ok());
      CHECK(dst == std::vector<float>(n, 42.0f));
      CHECK(small == std::vector<float>(n - 1, 42.0f));
    }
}

TEST_CASE("codec table: a codec's settings at a level keep the run's value type and block") {
  codec_settings run;
  run.values = value_type::bf16;
  run.block = 512;
  run.scale_block = 32;
  run.error_feedback = true;
  for (const codec* c : all_codecs()) {
    INFO(c->name());
    for (const double ratio : {0.05, 0.5, 1.0}) {
      const codec_settings s = c->at(ratio, run);
      if (s.kind == codec_kind::none) {
        CHECK(s == codec_settings{});  // raw carries no settings
        continue;
      }
      CHECK(s.kind == c->kind());
      // adatopk's top-k rungs (below its int4 level) send int8 values whatever the run's.
      CHECK(s.values == (c->adaptive() && ratio < int4_level ? value_type::int8 : run.values));
      CHECK(s.block == run.block);
      CHECK(s.scale_block == run.scale_block);
      CHECK(s.error_feedback);
      CHECK(s.keep_ratio > 0);
      CHECK(s.keep_ratio <= 1);
    }
  }
}

TEST_CASE("codec table: what topk's level means, in the codec only") {
  codec_settings run;
  // topk at 1 keeps every element and rounds the values; adatopk's 1 is "raw fits".
  const codec_settings topk1 = codec_of(codec_kind::topk).at(1.0, run);
  CHECK(topk1.keep_ratio < 1);
  CHECK(codec_of(codec_kind::topk).encodes(4096, topk1));
  CHECK(codec_of(codec_kind::topk).describe(topk1) == "topk 100% f16");
  const codec_settings ada1 = codec_of(codec_kind::adatopk).at(1.0, run);
  CHECK(ada1.keep_ratio == 1);
  CHECK_FALSE(codec_of(codec_kind::adatopk).encodes(4096, ada1));
  CHECK(codec_of(codec_kind::adatopk).describe(ada1) == "adatopk dense");
  CHECK(codec_of(codec_kind::adatopk).adaptive());
  CHECK_FALSE(codec_of(codec_kind::topk).adaptive());
  CHECK(codec_of(codec_kind::adatopk).wire_encoding() == codec_kind::topk);
  // Ratios outside (0, 1] are clamped into it rather than handed to an encoder that refuses.
  CHECK(codec_of(codec_kind::topk).at(0.0, run).keep_ratio > 0);
  CHECK(codec_of(codec_kind::adatopk).at(7.0, run).keep_ratio == 1);
  codec_settings ef = codec_of(codec_kind::topk).at(0.1, run);
  ef.error_feedback = true;
  CHECK(codec_of(codec_kind::topk).describe(ef) == "topk 10% f16 ef");
  CHECK(codec_of(codec_kind::none).describe({}) == "none");
}

}  // namespace fusion
