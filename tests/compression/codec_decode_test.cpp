// The topk edge codec (compression/topk.hpp), receiving side and edge encoder: every
// validation error of the decoder (destination untouched), truncation, a mutation fuzz loop,
// payload size bounds, and the edge encoder's choice and error feedback.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include "compression/topk.hpp"
#include "tests/compression/codec_test_util.hpp"

using namespace fusion;
using namespace fusion::codec_test;
TEST_CASE("codec: malformed payloads are rejected with a reason, the destination untouched") {
  // Block 64 over 100 elements: a full block and a tail of 36.
  //   idx: k 4/2, u16 indices, f16 values: block 0 at 32 (8 + 8 bytes), block 1 at 48 (4 + 4)
  //   bmp: k 32/18, bitmaps, f32 values: block 0 at 32 (8 + 128 bytes), block 1 at 168 (5 + 72)
  const auto x = normal_data(100, 3);
  payload_t idx, bmp;
  encode_topk(x, 0.05, value_type::f16, 64, idx);
  encode_topk(x, 0.5, value_type::f32, 64, bmp);
  REQUIRE(idx.size() == 56);
  REQUIRE(static_cast<uint8_t>(idx[5]) == 0);
  REQUIRE(bmp.size() == 245);
  REQUIRE(static_cast<uint8_t>(bmp[5]) == 1);
  auto with = [](payload_t p, auto edit) { edit(p); return p; };
  check_rejected(payload_t(31), 100, "shorter than the 32-byte header");
  check_rejected(with(idx, [](payload_t& p) { p[3] = std::byte{'2'}; }), 100, "bad magic");
  check_rejected(with(idx, [](payload_t& p) { p[4] = std::byte{4}; }), 100, "unknown value type 4");
  check_rejected(with(idx, [](payload_t& p) { p[5] = std::byte{2}; }), 100, "unknown index form 2");
  check_rejected(with(idx, [](payload_t& p) { p[7] = std::byte{1}; }), 100, "reserved");
  check_rejected(with(idx, [](payload_t& p) { p[30] = std::byte{1}; }), 100, "reserved");
  check_rejected(idx, 99, "carries 100 elements, the destination holds 99");
  check_rejected(with(idx, [](payload_t& p) { wr<uint32_t>(p, 16, 0); }), 100, "block of 0 elements");
  check_rejected(with(idx, [](payload_t& p) { wr<uint32_t>(p, 16, 65537); }), 100, "block of 65537 elements");
  check_rejected(with(idx, [](payload_t& p) { wr<uint32_t>(p, 20, 65); }), 100, "keeps 65 per block of 64");
  check_rejected(with(idx, [](payload_t& p) { wr<uint32_t>(p, 24, 37); }), 100, "keeps 37 in the last block of 36");
  check_rejected(with(idx, [](payload_t& p) { wr<uint64_t>(p, 8, 128); }), 128, "multiple of the block");
  check_rejected(with(idx, [](payload_t& p) { p.push_back(std::byte{0}); }), 100, "57 bytes, the header implies 56");
  check_rejected(with(idx, [](payload_t& p) { p.pop_back(); }), 100, "the header implies");
  auto huge = [](payload_t& p) {  // 2^62 blocks of 1 element, 4 bytes each
    wr<uint64_t>(p, 8, uint64_t{1} << 62);
    wr<uint32_t>(p, 16, 1);
    wr<uint32_t>(p, 20, 1);
    wr<uint32_t>(p, 24, 0);
  };
  check_rejected(with(idx, huge), 100, "more than 2^64");
  check_rejected(with(idx, [](payload_t& p) { wr<uint64_t>(p, 8, ~uint64_t{0}); }), 100, "the header implies");
  check_rejected(with(idx, [](payload_t& p) { wr<uint16_t>(p, 38, 64); }), 100,
                 "index 64 outside its block of 64 elements (block 0)");
  check_rejected(with(idx, [](payload_t& p) { wr<uint16_t>(p, 50, 36); }), 100,
                 "index 36 outside its block of 36 elements (block 1)");
  check_rejected(with(idx, [](payload_t& p) { wr<uint16_t>(p, 32, rd<uint16_t>(p, 34)); }), 100, "not ascending");
  check_rejected(with(idx, [](payload_t& p) { wr<uint16_t>(p, 32, 50), wr<uint16_t>(p, 34, 3); }), 100,
                 "not ascending (3 after 50) (block 0)");
  check_rejected(with(bmp, [](payload_t& p) { p[32] ^= std::byte{1}; }), 100, "bits set, the header says 32 (block 0)");
  check_rejected(with(bmp, [](payload_t& p) { p[172] |= std::byte{0x80}; }), 100,
                 "bits set past the 36 elements of its block (block 1)");
  check_rejected(with(bmp, [](payload_t& p) { p[168] ^= std::byte{1}; }), 100, "the header says 18 (block 1)");
}

TEST_CASE("codec: truncated payloads are rejected at every length") {
  for (const double ratio : {0.05, 0.5}) {
    payload_t p;
    encode_topk(normal_data(70, 9), ratio, value_type::bf16, 16, p);
    for (size_t len = 0; len < p.size(); ++len)
      check_rejected(payload_t(p.begin(), p.begin() + static_cast<long>(len)), 70, "topk payload: ");
  }
}

TEST_CASE("codec: random mutations never crash the decoder") {
  std::mt19937 rng(1234);
  std::vector<payload_t> seeds;
  for (double ratio : {0.02, 0.3, 1.0})
    for (auto vt : {value_type::f32, value_type::f16, value_type::bf16}) {
      seeds.emplace_back();
      encode_topk(normal_data(300, static_cast<uint32_t>(seeds.size())), ratio, vt, 64, seeds.back());
    }
  size_t decoded = 0, rejected = 0, touched = 0;
  for (int it = 0; it < 30000; ++it) {
    payload_t p = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const uint32_t what = rng() % 10;
      if (what < 5 && !p.empty())
        p[rng() % p.size()] = static_cast<std::byte>(rng());  // any byte
      else if (what < 8 && p.size() >= 32)
        p[8 + rng() % 24] = static_cast<std::byte>(rng());    // the header's sizes
      else if (what == 8 && !p.empty())
        p.resize(rng() % p.size());                           // truncated
      else
        p.resize(p.size() + 1 + rng() % 8, static_cast<std::byte>(rng()));  // extended
    }
    uint64_t n = 300;
    if (rng() % 2 && topk_payload_elements(p, n) && n > 100000) n = 300;
    std::vector<float> d(n, 42.0f);
    if (decode_topk(p, d).ok()) {
      ++decoded;
    } else {
      ++rejected;
      touched += !std::all_of(d.begin(), d.end(), [](float v) { return v == 42.0f; });
    }
  }
  CHECK(touched == 0);
  CHECK(rejected > 0);
  CHECK(decoded > 0);  // value bytes are free, so some mutations stay valid
}

TEST_CASE("codec: payload sizes, the header's n and the upper bound") {
  payload_t p;
  const auto x = normal_data(1000, 4);
  uint64_t n = 0;
  encode_topk(x, 0.1, value_type::f16, 256, p);
  CHECK((topk_payload_elements(p, n) && n == 1000));
  CHECK_FALSE(topk_payload_elements(std::span<const std::byte>(p.data(), 31), n));
  // The largest decodable payload: block 1, every element kept as a u16 index and an int8 value
  // with a scale of its own (value block 1); with an fp32 value a byte less per element.
  payload_t big(codec_header_bytes + 6 * x.size());
  std::memcpy(big.data(), "FZK1", 4);
  wr<uint64_t>(big, 8, x.size());
  wr<uint32_t>(big, 16, 1);
  wr<uint32_t>(big, 20, 1);
  for (size_t i = 0; i < x.size(); ++i) wr<float>(big, 32 + 6 * i + 2, x[i]);
  std::vector<float> d(x.size());
  REQUIRE(decode_topk(big, d).ok());
  CHECK(d == x);
  CHECK(big.size() + x.size() == topk_max_payload_bytes(x.size()));
  // (the encoder picks bitmaps there, 6 bytes per element; a u16 index is what a decoder must allow)
  CHECK(topk_payload_bytes(x.size(), 1.0, value_type::int8, 1, 1) + x.size() == topk_max_payload_bytes(x.size()));
  for (uint32_t block : {1u, 7u, 4096u})
    for (auto vt : {value_type::f32, value_type::bf16, value_type::int8})
      for (double r : {0.001, 0.5, 1.0})
        CHECK(topk_payload_bytes(12345, r, vt, block) <= topk_max_payload_bytes(12345));
  CHECK(topk_max_payload_bytes(~uint64_t{0}) == ~uint64_t{0});
  CHECK(topk_payload_bytes(~uint64_t{0}, 1.0, value_type::f32, 1) == ~uint64_t{0});
}

TEST_CASE("codec: edge_encoder encodes only when that is smaller") {
  edge_encoder none;
  CHECK(none.settings().kind == codec_kind::none);
  CHECK_FALSE(codec_settings{}.error_feedback);
  CHECK_FALSE(none.encodes(1 << 20));
  payload_t p;
  CHECK_THROWS_AS(none.encode(normal_data(8, 1), 0, p), std::invalid_argument);
  edge_encoder e({codec_kind::topk, 0.1, value_type::f16, 4096, false});
  CHECK(e.encodes(1 << 20));
  CHECK_FALSE(e.encodes(0));
  CHECK_FALSE(e.encodes(4));  // the 32-byte header outweighs 16 bytes
  e.set({codec_kind::adatopk, 1.0, value_type::f32, 4096, false});
  CHECK_FALSE(e.encodes(1 << 20));  // everything kept costs more than dense
  e.set({codec_kind::topk, 1.0, value_type::f16, 4096, false});
  CHECK_FALSE(e.encodes(1 << 20));  // ratio 1 is dense and exact, never rounded to f16
  // Without error feedback the payload is the plain encoding, the same every time.
  e.set({codec_kind::topk, 0.1, value_type::f16, 256, false});
  const auto x = normal_data(1000, 2);
  payload_t a, b, ref;
  e.encode(x, 0, a);
  e.encode(x, 0, b);
  encode_topk(x, 0.1, value_type::f16, 256, ref);
  CHECK((a == ref && b == ref));
}

TEST_CASE("codec: error feedback carries what was not sent into later steps") {
  const size_t n = 4096;
  const auto x = normal_data(n, 8);
  const codec_settings s{codec_kind::topk, 0.1, value_type::f16, 512, true};
  edge_encoder with(s), other_slots(s), without({codec_kind::topk, 0.1, value_type::f16, 512, false});
  std::vector<double> sum_ef(n), sum_plain(n);
  std::vector<float> d(n);
  payload_t p, q;
  const int steps = 200;
  for (int t = 0; t < steps; ++t) {
    with.encode(x, 0, p);
    other_slots.encode(normal_data(n, 100 + t), 1, q);  // another slot's residual stays apart
    other_slots.encode(x, 0, q);
    CHECK(p == q);
    REQUIRE(decode_topk(p, d).ok());
    for (size_t i = 0; i < n; ++i) sum_ef[i] += d[i];
    without.encode(x, 0, p);
    REQUIRE(decode_topk(p, d).ok());
    for (size_t i = 0; i < n; ++i) sum_plain[i] += d[i];
  }
  double err_ef = 0, err_plain = 0, mass = 0;
  for (size_t i = 0; i < n; ++i) {
    err_ef += std::fabs(sum_ef[i] - steps * double{x[i]});
    err_plain += std::fabs(sum_plain[i] - steps * double{x[i]});
    mass += steps * std::fabs(double{x[i]});
  }
  CHECK(err_ef < 0.1 * mass);     // the sum of what arrived approaches the sum sent
  CHECK(err_plain > 0.5 * mass);  // without it, most elements never arrive
  // Switching error feedback off drops the residual: the next encoding starts clean.
  payload_t ref;
  encode_topk(x, 0.1, value_type::f16, 512, ref);
  with.encode(x, 0, p);
  CHECK(p != ref);
  with.set({codec_kind::topk, 0.1, value_type::f16, 512, false});
  with.set(s);
  with.encode(x, 0, p);
  CHECK(p == ref);
  // Non-finite inputs do not poison the residual.
  std::vector<float> y = x;
  y[5] = nan_f;
  y[9] = 1e9f;  // overflows fp16
  with.encode(y, 0, p);
  for (int t = 0; t < 3; ++t) with.encode(x, 0, p);
  REQUIRE(decode_topk(p, d).ok());
  CHECK(std::all_of(d.begin(), d.end(), [](float v) { return std::isfinite(v); }));
}
