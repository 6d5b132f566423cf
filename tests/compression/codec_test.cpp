// The topk edge codec (compression/topk.hpp), encoding side: the kept set against a
// brute-force reference, the selection kernel on hard inputs, fp16/bf16 rounding against an
// independent reference (and F16C where the CPU has it), the index form, argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "compression/topk.hpp"
#include "compression/half.hpp"
#include "compression/select.hpp"
#include "tests/compression/codec_test_util.hpp"

using namespace fusion;
using namespace fusion::codec_test;

namespace {

uint32_t wire_bits(float v, uint8_t vt) {
  return vt == 0 ? bits(v) : vt == 1 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
}
float from_wire(uint32_t b, uint8_t vt) {
  const auto h = static_cast<uint16_t>(b);
  return vt == 0 ? std::bit_cast<float>(b) : vt == 1 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
}

// Encodes x and checks everything against the documented layout, read here by hand: sizes,
// header, index form, the kept set per block, the value bits, and the decoded tensor.
void check_encoding(const std::vector<float>& x, double ratio, value_type vt, uint32_t block) {
  CAPTURE(x.size());
  CAPTURE(ratio);
  CAPTURE(block);
  CAPTURE(to_string(vt));
  payload_t p;
  encode_topk(x, ratio, vt, block, p);
  const uint64_t n = x.size(), full = n / block, tail = n % block;
  const uint32_t kf = keep_count(block, ratio), kt = keep_count(static_cast<uint32_t>(tail), ratio);
  REQUIRE(p.size() == topk_payload_bytes(n, ratio, vt, block));
  REQUIRE(p.size() >= codec_header_bytes);
  CHECK(std::memcmp(p.data(), "FZK1", 4) == 0);
  const auto v = static_cast<uint8_t>(p[4]), form = static_cast<uint8_t>(p[5]);
  CHECK(v == static_cast<uint8_t>(vt));
  CHECK(rd<uint64_t>(p, 8) == n);
  CHECK(rd<uint32_t>(p, 16) == block);
  CHECK(rd<uint32_t>(p, 20) == kf);
  CHECK(rd<uint32_t>(p, 24) == kt);
  const uint64_t index_bytes = 2 * (full * kf + kt), bitmap_bytes = full * ((block + 7) / 8) + (tail + 7) / 8;
  CHECK(form == (index_bytes <= bitmap_bytes ? 0 : 1));
  size_t off = codec_header_bytes, bad_set = 0, bad_value = 0;
  const size_t vb = v == 0 ? 4 : 2;
  std::vector<float> expect(n, 0.0f);
  for (uint64_t base = 0; base < n; base += block) {
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(block, n - base)), k = len == block ? kf : kt;
    std::vector<uint32_t> pos;
    if (form == 1) {
      for (uint32_t i = 0; i < len; ++i)
        if (static_cast<uint8_t>(p[off + i / 8]) >> (i % 8) & 1) pos.push_back(i);
      off += (len + 7) / 8;
    } else {
      for (uint32_t j = 0; j < k; ++j) pos.push_back(rd<uint16_t>(p, off + 2 * j));
      off += 2 * size_t{k};
    }
    bad_set += pos != reference_kept(x.data() + base, len, k);
    for (uint32_t j = 0; j < k && j < pos.size(); ++j) {
      const uint32_t got = vb == 4 ? rd<uint32_t>(p, off + 4 * j) : rd<uint16_t>(p, off + 2 * j);
      bad_value += got != wire_bits(x[base + pos[j]], v);
      expect[base + pos[j]] = from_wire(got, v);
    }
    off += vb * k;
  }
  CHECK(bad_set == 0);
  CHECK(bad_value == 0);
  CHECK(off == p.size());
  std::vector<float> d(n, 42.0f);
  REQUIRE(decode_topk(p, d).ok());
  size_t bad_decoded = 0;
  for (size_t i = 0; i < n; ++i) bad_decoded += bits(d[i]) != bits(expect[i]);
  CHECK(bad_decoded == 0);
}

// Nearest-even rounding by search over the positive values of a 16-bit format (value(h) is
// monotone in h up to inf, which counts as the next binade for rounding).
template <class Value>
uint16_t reference_round(float f, uint16_t inf_bits, Value value) {
  const double a = std::fabs(static_cast<double>(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  uint32_t lo = 0, hi = inf_bits;  // value(lo) <= a < value(hi)
  if (a >= value(hi)) return sign | inf_bits;
  while (hi - lo > 1) (value((lo + hi) / 2) <= a ? lo : hi) = (lo + hi) / 2;
  const double dl = a - value(lo), dh = value(hi) - a;
  return static_cast<uint16_t>(sign | (dl < dh || (dl == dh && lo % 2 == 0) ? lo : hi));
}
double f16_value(uint32_t h) {
  const uint32_t e = h >> 10, m = h & 0x3ff;
  return e == 31 ? 65536.0 : e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, static_cast<int>(e) - 25);
}
double bf16_value(uint32_t h) {
  return h == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(std::bit_cast<float>(h << 16));
}

}  // namespace

TEST_CASE("codec: names print and parse") {
  for (auto k : {codec_kind::none, codec_kind::topk, codec_kind::adatopk}) {
    codec_kind out{};
    CHECK((parse_codec_kind(to_string(k), out) && out == k));
  }
  for (auto v : {value_type::f32, value_type::f16, value_type::bf16}) {
    value_type out{};
    CHECK((parse_value_type(to_string(v), out) && out == v));
  }
  codec_kind k{};
  value_type v{};
  CHECK_FALSE(parse_codec_kind("TopK", k));
  CHECK_FALSE(parse_value_type("fp16", v));
  CHECK(to_string(codec_kind::adatopk) == "adatopk");
  CHECK(to_string(value_type::bf16) == "bf16");
}

TEST_CASE("codec: keep_count is ceil(ratio * len), at least 1, at most len") {
  CHECK(keep_count(4096, 0.1) == 410);
  CHECK(keep_count(4096, 0.01) == 41);
  CHECK(keep_count(100, 0.07) == 7);  // 0.07 * 100 is 7.000000000000001 in binary
  CHECK(keep_count(100, 0.29) == 29);
  CHECK(keep_count(10, 0.001) == 1);
  CHECK(keep_count(10, 1.0) == 10);
  CHECK(keep_count(10, 0.95) == 10);
  CHECK(keep_count(0, 0.5) == 0);
  CHECK(keep_count(7, 2.0) == 7);
  CHECK(keep_count(7, 0.0) == 1);
  CHECK(keep_count(7, std::nan("")) == 1);
  CHECK(keep_count(65536, 0.3) == 19661);
}

TEST_CASE("codec: the kept set is the k largest magnitudes of every block") {
  const double ratios[] = {0.001, 0.01, 0.0625, 0.1, 0.3, 0.5, 0.999, 1.0};
  const value_type types[] = {value_type::f32, value_type::f16, value_type::bf16};
  uint32_t seed = 1;
  for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{8}, size_t{9}, size_t{100}, size_t{1000}, size_t{4095},
                   size_t{4096}, size_t{4097}, size_t{10000}})
    for (uint32_t block : {1u, 2u, 3u, 8u, 100u, 256u, 4096u, 65536u})
      for (double ratio : ratios) {
        ++seed;
        check_encoding(normal_data(n, seed), ratio, types[seed % 3], block);
      }
  // Several full blocks of the largest size, and a long tail.
  for (double ratio : {0.01, 0.3}) check_encoding(normal_data(3 * 65536 + 1234, seed++), ratio, value_type::f16, 65536);
}

TEST_CASE("codec: hard distributions: ties, zeros, scales changing by block, non-finite values") {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> cases;
  cases.push_back(std::vector<float>(5000, 1.5f));   // all equal
  cases.push_back(std::vector<float>(5000, 0.0f));   // all zero
  std::vector<float> levels(20000), signs(20000), sparse(20000, 0.0f);
  std::vector<float> scales = normal_data(300000, 3), specials = normal_data(9000, 4);
  for (auto& v : levels) v = static_cast<float>(rng() % 4) * 0.25f;      // four values: heavy ties
  for (size_t i = 0; i < signs.size(); ++i) signs[i] = (i % 3 ? 1.0f : -1.0f) * static_cast<float>(rng() % 3);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] *= std::ldexp(1.0f, static_cast<int>((i / 4096) % 7) * 9 - 30);
  for (size_t i = 0; i < sparse.size(); i += 37) sparse[i] = static_cast<float>(i % 5) - 2.0f;
  for (size_t i = 0; i < specials.size(); i += 101) specials[i] = i % 3 == 0 ? nan_f : i % 3 == 1 ? inf_f : -inf_f;
  for (size_t i = 50; i < specials.size(); i += 211) specials[i] = std::ldexp(1.0f, -140);  // fp32 subnormal
  for (auto* c : {&levels, &signs, &scales, &sparse, &specials}) cases.push_back(*c);
  std::vector<float> ramp(70000);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i % 9000) - 4500.0f;  // ascending runs
  cases.push_back(ramp);
  for (const auto& x : cases)
    for (double ratio : {0.001, 0.05, 0.1, 0.3, 0.7})
      for (uint32_t block : {64u, 1000u, 4096u, 65536u}) check_encoding(x, ratio, value_type::f16, block);
}

TEST_CASE("codec: ties go to the lowest indices") {
  std::vector<float> x = {1, -3, 2, 3, 3, -3, 0, 3};  // |3| at 1, 3, 4, 5, 7
  payload_t p;
  encode_topk(x, 3.0 / 8, value_type::f32, 8, p);      // k = 3: indices 1, 3, 4
  std::vector<float> d(8);
  REQUIRE(decode_topk(p, d).ok());
  CHECK(d == std::vector<float>{0, -3, 0, 3, 3, 0, 0, 0});
  std::vector<float> z = {0.0f, -0.0f, 0.0f, -0.0f};  // +0 and -0 tie
  encode_topk(z, 0.5, value_type::f32, 4, p);
  REQUIRE(decode_topk(p, std::span<float>(d.data(), 4)).ok());
  CHECK(bits(d[1]) == 0x80000000u);  // -0 kept at index 1, 0 elsewhere
}

TEST_CASE("codec: NaN ranks above inf, inf above every number") {
  std::vector<float> x = {5, -inf_f, 1e30f, nan_f, 2, inf_f, 7, 3};
  payload_t p;
  encode_topk(x, 3.0 / 8, value_type::f16, 8, p);
  std::vector<float> d(8);
  REQUIRE(decode_topk(p, d).ok());
  CHECK(std::isnan(d[3]));
  CHECK(d[1] == -inf_f);
  CHECK(d[5] == inf_f);
  CHECK(std::count(d.begin(), d.end(), 0.0f) == 5);
  CHECK(f32_to_f16_bits(nan_f) == 0x7e00);
  CHECK(f32_to_bf16_bits(-nan_f) == 0xffc0);
}

TEST_CASE("codec: the selection kernel carries its hint across very different blocks") {
  topk_detail::select_scratch s;
  std::mt19937 rng(11);
  std::vector<float> vals(65536 + 16);
  std::vector<uint16_t> idx(65536 + 16);
  size_t bad = 0;
  for (int round = 0; round < 400; ++round) {
    const uint32_t len = round % 50 == 0 ? 65536 : 1 + rng() % 5000, k = rng() % (len + 1);
    auto x = normal_data(len, static_cast<uint32_t>(round), std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30));
    if (round % 7 == 0)
      for (auto& v : x) v = std::round(v * 4 / std::fabs(x[0] + 1e-30f));  // few distinct values
    const auto cut = topk_detail::select_block(x.data(), len, k, s);
    const uint32_t got = topk_detail::emit_block(x.data(), len, cut, vals.data(), idx.data(), nullptr);
    const auto ref = reference_kept(x.data(), len, k);
    bad += got != k || !std::equal(ref.begin(), ref.end(), idx.begin());
  }
  CHECK(bad == 0);
}

TEST_CASE("codec: fp16 rounding is bit-exact") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65519.996f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);                        // halfway to 2^16 overflows
  CHECK(f32_to_f16_bits(1e10f) == 0x7c00);
  CHECK(f32_to_f16_bits(-inf_f) == 0xfc00);
  CHECK(f32_to_f16_bits(1.0f + 0x1p-11f) == 0x3c00);                 // tie, down to even
  CHECK(f32_to_f16_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);             // tie, up to even
  CHECK(f32_to_f16_bits(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);      // just above the tie
  CHECK(f32_to_f16_bits(0x1p-14f) == 0x0400);                        // smallest normal
  CHECK(f32_to_f16_bits(0x1p-24f) == 0x0001);                        // smallest subnormal
  CHECK(f32_to_f16_bits(0x1p-25f) == 0x0000);                        // tie, down to even zero
  CHECK(f32_to_f16_bits(0x1.8p-24f) == 0x0002);                      // tie, up to even
  CHECK(f32_to_f16_bits(0x1p-25f + 0x1p-40f) == 0x0001);
  CHECK(f32_to_f16_bits(0x1.ffcp-15f) == 0x0400);                    // 1023.5 units: up into the normals
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -140)) == 0x0000);          // fp32 subnormal
  CHECK(f32_to_f16_bits(std::bit_cast<float>(0x7f802001u)) == 0x7e01);  // signalling NaN quieted
  std::mt19937 rng(5);
  size_t bad = 0, bad_hw = 0;
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns, most of them in or near the fp16 range.
    const uint32_t b = i % 4 ? (rng() & 0x807fffffu) | ((96 + rng() % 50) << 23) : static_cast<uint32_t>(rng());
    const float f = std::bit_cast<float>(b);
    if (!std::isnan(f)) bad += f32_to_f16_bits(f) != reference_round(f, 0x7c00, f16_value);
#if defined(__F16C__)
    bad_hw += f32_to_f16_bits(f) != _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#endif
  }
  CHECK(bad == 0);
  CHECK(bad_hw == 0);  // the hardware converter agrees, NaNs included
}

TEST_CASE("codec: bf16 rounding is bit-exact") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(1.0f + 0x1p-8f) == 0x3f80);                  // tie, down to even
  CHECK(f32_to_bf16_bits(1.0f + 3 * 0x1p-8f) == 0x3f82);              // tie, up to even
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  CHECK(f32_to_bf16_bits(std::ldexp(1.0f, -130)) == 0x0008);           // subnormal kept
  CHECK(f32_to_bf16_bits(-inf_f) == 0xff80);
  std::mt19937 rng(6);
  size_t bad = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) bad += f32_to_bf16_bits(f) != reference_round(f, 0x7f80, bf16_value);
  }
  CHECK(bad == 0);
}

TEST_CASE("codec: fp16 and bf16 widen exactly") {
  size_t bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<uint16_t>(h);
    const float f = f16_bits_to_f32(b), g = bf16_bits_to_f32(b);
    const uint32_t mag = h & 0x7fff;
    if (mag < 0x7c00) bad += std::fabs(f) != f16_value(mag) || std::signbit(f) != (h >> 15 == 1);
    if (mag == 0x7c00) bad += !std::isinf(f);
    if (mag > 0x7c00) bad += !std::isnan(f);
    if (mag <= 0x7c00) bad += f32_to_f16_bits(f) != b;  // narrowing a widened value is the identity
    if (!std::isnan(g)) bad += f32_to_bf16_bits(g) != b;
  }
  CHECK(bad == 0);
}

TEST_CASE("codec: the smaller index form is chosen, ties go to indices") {
  payload_t p;
  auto x = normal_data(16, 1);
  encode_topk(x, 1.0 / 16, value_type::f16, 16, p);  // 2 bytes of indices vs a 2-byte bitmap
  CHECK(static_cast<uint8_t>(p[5]) == 0);
  encode_topk(x, 2.0 / 16, value_type::f16, 16, p);  // 4 bytes vs 2
  CHECK(static_cast<uint8_t>(p[5]) == 1);
  auto y = normal_data(4096 * 3, 2);
  encode_topk(y, 0.01, value_type::f16, 4096, p);
  CHECK(static_cast<uint8_t>(p[5]) == 0);
  CHECK(p.size() == 32 + 3 * 41 * 4);
  encode_topk(y, 0.3, value_type::bf16, 4096, p);
  CHECK(static_cast<uint8_t>(p[5]) == 1);
  CHECK(p.size() == 32 + 3 * (512 + 1229 * 2));
}

TEST_CASE("codec: an empty tensor encodes as a bare header") {
  payload_t p;
  encode_topk({}, 0.1, value_type::f16, 4096, p);
  CHECK(p.size() == codec_header_bytes);
  CHECK(topk_payload_bytes(0, 0.1, value_type::f16, 4096) == codec_header_bytes);
  std::vector<float> d;
  CHECK(decode_topk(p, d).ok());
  uint64_t n = 7;
  CHECK((topk_payload_elements(p, n) && n == 0));
}

TEST_CASE("codec: encode rejects bad settings") {
  payload_t p;
  std::vector<float> x(10, 1.0f);
  for (double r : {0.0, -0.5, 1.5, std::nan("")})
    CHECK_THROWS_AS(encode_topk(x, r, value_type::f16, 8, p), std::invalid_argument);
  for (uint32_t b : {0u, 65537u}) CHECK_THROWS_AS(encode_topk(x, 0.5, value_type::f16, b, p), std::invalid_argument);
  CHECK_THROWS_AS(encode_topk(x, 0.5, static_cast<value_type>(7), 8, p), std::invalid_argument);
}
