// The int8 and int4 codecs (compression/quant.hpp): the per-value error bound, the exact
// layout, zero and non-finite blocks, odd lengths, the encoder paths writing the same bytes,
// damaged payloads refused by name, error feedback through edge_encoder, and the codecs' place
// in the table and on AdaTopK's levels. The table's uniform checks (codec_table_test.cpp) run on
// them too.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/quant.hpp"
#include "compression/topk.hpp"
#include "tests/compression/codec_test_util.hpp"

namespace fusion {
namespace {

using codec_test::inf_f;
using codec_test::nan_f;
using codec_test::normal_data;
using codec_test::payload_t;
using codec_test::rd;
using codec_test::wr;

// |x - y| <= scale / 2, plus the fp32 rounding of the division and of the product.
bool within_half_step(float x, float y, float scale) {
  return std::fabs(double{x} - y) <= double{scale} * 0.5 + (std::fabs(double{x}) + scale) * 3e-7;
}

uint64_t blocks_of(uint64_t n, uint32_t block) { return (n + block - 1) / block; }

// Decoding must fail with `reason` in the message and leave dst as it was.
void check_rejected(const payload_t& p, size_t n, const std::string& reason) {
  std::vector<float> d(n, 42.0f);
  const status s = decode_quant(p, d);
  const std::string err = s.error();
  CAPTURE(err);
  CHECK_FALSE(s.ok());
  CHECK(err.find(reason) != std::string::npos);
  CHECK(std::all_of(d.begin(), d.end(), [](float v) { return v == 42.0f; }));
}

// Inputs that stress every path: exact halves (ties), values on and past the block's absmax,
// signed zeros, subnormals, huge and tiny blocks.
std::vector<float> hard_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> kind(0, 7), code(-127, 127);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    switch (kind(rng)) {
      case 0: x[i] = (code(rng) + 0.5f) * 0.25f; break;  // a tie when the block's scale is 0.25
      case 1: x[i] = 31.75f; break;                      // absmax 31.75 -> scale 0.25
      case 2: x[i] = -0.0f; break;
      case 3: x[i] = std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x807fffffu); break;  // subnormal
      case 4: x[i] = std::ldexp(static_cast<float>(code(rng)), 100); break;
      case 5: x[i] = std::ldexp(static_cast<float>(code(rng)), -120); break;
      default: x[i] = std::normal_distribution<float>(0.0f, 3.0f)(rng);
    }
  }
  return x;
}

}  // namespace

TEST_CASE("quant: every value comes back within half its block's scale") {
  for (const unsigned bits : {8u, 4u})
    for (const uint32_t block : {1u, 7u, 32u, 64u, 256u})
      for (const size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1001}}) {
        CAPTURE(bits);
        CAPTURE(block);
        CAPTURE(n);
        const auto x = normal_data(n, static_cast<uint32_t>(n * 31 + block), 2.0f);
        payload_t p;
        encode_quant(x, bits, block, p);
        REQUIRE(p.size() == quant_payload_bytes(n, bits, block));
        std::vector<float> y(n);
        REQUIRE(decode_quant(p, y).ok());
        const float q = bits == 8 ? 127.0f : 7.0f;
        for (size_t i = 0; i < n; ++i) {
          const size_t b = i / block;
          const float scale = rd<float>(p, quant_header_bytes + 4 * b);
          float absmax = 0;
          for (size_t j = b * block; j < std::min<size_t>(n, (b + 1) * block); ++j)
            absmax = std::max(absmax, std::fabs(x[j]));
          CHECK(scale == absmax / q);
          CHECK(within_half_step(x[i], y[i], scale));
        }
      }
}

TEST_CASE("quant: the payload layout, byte by byte") {
  // int4, block 2, n 5: three scales, three code bytes (the last high nibble is padding).
  const std::vector<float> x = {7.0f, -3.5f, 0.0f, 0.0f, -14.0f};
  payload_t p;
  encode_quant(x, 4, 2, p);
  REQUIRE(p.size() == 24 + 3 * 4 + 3);
  CHECK(std::memcmp(p.data(), "FZQ1", 4) == 0);
  CHECK(static_cast<uint8_t>(p[4]) == 4);
  CHECK(static_cast<uint8_t>(p[5]) == 0);
  CHECK(rd<uint16_t>(p, 6) == 0);
  CHECK(rd<uint64_t>(p, 8) == 5);
  CHECK(rd<uint32_t>(p, 16) == 2);
  CHECK(rd<uint32_t>(p, 20) == 0);
  CHECK(rd<float>(p, 24) == 1.0f);  // 7 / 7
  CHECK(rd<float>(p, 28) == 0.0f);  // the all-zero block
  CHECK(rd<float>(p, 32) == 2.0f);  // 14 / 7
  // -3.5 / 1 = -3.5 rounds to even: -4 (0xc); codes 7 (0x7) and -4 in byte 0.
  CHECK(static_cast<uint8_t>(p[36]) == 0xc7);
  CHECK(static_cast<uint8_t>(p[37]) == 0x00);
  CHECK(static_cast<uint8_t>(p[38]) == 0x09);  // -7 in the low nibble, zero padding above
  // int8: one byte per code.
  encode_quant(x, 8, 4, p);
  REQUIRE(p.size() == 24 + 2 * 4 + 5);
  CHECK(rd<float>(p, 24) == 7.0f / 127.0f);
  CHECK(static_cast<int8_t>(p[32]) == 127);
  CHECK(static_cast<int8_t>(p[33]) == static_cast<int8_t>(std::nearbyint(-3.5f / (7.0f / 127.0f))));
  CHECK(static_cast<int8_t>(p[36]) == -127);
}

TEST_CASE("quant: an absmax near the largest float decodes finite, within half a step") {
  // FLT_MAX / 127 rounds up, and 127 x that scale overflowed to inf (found by fuzz_codec).
  const float big = std::numeric_limits<float>::max();
  for (const unsigned bits : {8u, 4u}) {
    const std::vector<float> x = {big, -big, 2.976e38f, 1.0f, 0.0f};
    for (const quant_path path : quant_paths()) {
      payload_t p;
      encode_quant(x, bits, 64, p, path);
      std::vector<float> y(x.size());
      REQUIRE(decode_quant(p, y).ok());
      const double step = rd<float>(p, quant_header_bytes);
      for (size_t i = 0; i < x.size(); ++i) {
        INFO(bits << "-bit, path " << to_string(path) << ", element " << i);
        CHECK(std::isfinite(y[i]));
        CHECK(std::fabs(double{y[i]} - x[i]) <= step / 2);
      }
    }
  }
}

TEST_CASE("quant: all-zero blocks decode to zero, next to blocks that are not") {
  std::vector<float> x(300, 0.0f);
  x[5] = 1.0f;
  x[200] = -0.0f;
  for (const unsigned bits : {8u, 4u}) {
    payload_t p;
    encode_quant(x, bits, 64, p);
    for (size_t b = 1; b < 5; ++b) CHECK(rd<uint32_t>(p, quant_header_bytes + 4 * b) == 0);  // +0, never -0
    std::vector<float> y(x.size(), 42.0f);
    REQUIRE(decode_quant(p, y).ok());
    CHECK(y[5] == 1.0f);
    for (size_t i = 0; i < y.size(); ++i)
      if (i != 5) CHECK(y[i] == 0.0f);
  }
  // n = 0: the bare header.
  payload_t p;
  encode_quant(std::vector<float>{}, 8, 64, p);
  CHECK(p.size() == quant_header_bytes);
  std::vector<float> none;
  CHECK(decode_quant(p, none).ok());
}

TEST_CASE("quant: inf and NaN are refused by name on every path") {
  for (const quant_path path : quant_paths())
    for (const unsigned bits : {8u, 4u})
      for (const float bad : {nan_f, inf_f, -inf_f}) {
        CAPTURE(to_string(path));
        std::vector<float> x = normal_data(200, 3);
        x[130] = bad;
        x[190] = nan_f;  // a later one is not the one named
        payload_t p;
        try {
          encode_quant(x, bits, 64, p, path);
          FAIL("a non-finite element was encoded");
        } catch (const std::invalid_argument& e) {
          const std::string what = e.what();
          CAPTURE(what);
          CHECK(what.find(bits == 8 ? "int8: " : "int4: ") == 0);
          CHECK(what.find("element 130 of the tensor is " + std::string(std::isnan(bad) ? "NaN" : "infinite")) !=
                std::string::npos);
          CHECK(what.find("(block 2)") != std::string::npos);
          CHECK(what.find("finite values only") != std::string::npos);
        }
      }
}

TEST_CASE("quant: every encoder path writes the scalar path's bytes") {
  const auto paths = quant_paths();
  REQUIRE(paths.front() == quant_path::scalar);
  CHECK(quant_best_path() == paths.back());
  MESSAGE("quant paths on this CPU: " << paths.size() << " (best: " << to_string(quant_best_path()) << ")");
  if (paths.back() != quant_path::avx512) {  // asked for a path this CPU lacks: refused, no SIGILL
    payload_t p;
    CHECK_THROWS_AS(encode_quant(std::vector<float>(100, 1.0f), 8, 64, p, quant_path::avx512), std::invalid_argument);
  }
  for (const unsigned bits : {8u, 4u})
    for (const uint32_t block : {1u, 7u, 31u, 32u, 64u, 100u, 256u, 4096u})
      for (const size_t n : {size_t{1}, size_t{33}, size_t{1000}, size_t{20001}}) {
        CAPTURE(bits);
        CAPTURE(block);
        CAPTURE(n);
        for (uint32_t seed = 0; seed < 3; ++seed) {
          const auto x = seed == 0 ? normal_data(n, block) : hard_values(n, seed * 1000 + block);
          payload_t want;
          encode_quant(x, bits, block, want, quant_path::scalar);
          for (const quant_path path : paths) {
            CAPTURE(to_string(path));
            payload_t got;
            encode_quant(x, bits, block, got, path);
            CHECK(got == want);
          }
        }
      }
}

TEST_CASE("quant: odd lengths, partial last blocks and the int4 padding nibble") {
  for (const size_t n : {size_t{1}, size_t{3}, size_t{65}, size_t{127}}) {
    const auto x = normal_data(n, static_cast<uint32_t>(n));
    payload_t p;
    encode_quant(x, 4, 64, p);
    CHECK(p.size() == quant_header_bytes + 4 * blocks_of(n, 64) + (n + 1) / 2);
    CHECK((static_cast<uint8_t>(p.back()) >> 4) == 0);  // n is odd: padding
    std::vector<float> y(n);
    REQUIRE(decode_quant(p, y).ok());
    // The last element, alone in its byte and maybe in its block, survives.
    const float scale = rd<float>(p, quant_header_bytes + 4 * ((n - 1) / 64));
    CHECK(within_half_step(x.back(), y.back(), scale));
    // A padding nibble that is not zero is damage.
    p.back() = static_cast<std::byte>(static_cast<uint8_t>(p.back()) | 0x10u);
    check_rejected(p, n, "padding nibble");
  }
  // Blocks of odd size: a byte holds elements of two blocks.
  const auto x = normal_data(25, 9);
  payload_t p;
  encode_quant(x, 4, 5, p);
  std::vector<float> y(25);
  REQUIRE(decode_quant(p, y).ok());
  for (size_t i = 0; i < 25; ++i) CHECK(within_half_step(x[i], y[i], rd<float>(p, 24 + 4 * (i / 5))));
}

TEST_CASE("quant: damaged payloads are refused by name and the tensor is left alone") {
  const auto x = normal_data(100, 5);
  payload_t good8, good4;
  encode_quant(x, 8, 32, good8);
  encode_quant(x, 4, 32, good4);
  const size_t codes8 = quant_header_bytes + 4 * 4, codes4 = codes8;
  auto damaged = [](payload_t p, auto&& change) {
    change(p);
    return p;
  };
  check_rejected(payload_t(good8.begin(), good8.begin() + 10), 100, "shorter than the 24-byte header");
  check_rejected(payload_t(good8.begin(), good8.end() - 1), 100, "the header implies 140");
  check_rejected(damaged(good8, [](payload_t& p) { p.push_back(std::byte{0}); }), 100,
                 "141 bytes, the header implies 140");
  check_rejected(payload_t(good4.begin(), good4.end() - 1), 100, "the header implies 90");
  check_rejected(good8, 99, "carries 100 elements, the destination holds 99");
  check_rejected(damaged(good8, [](payload_t& p) { p[0] = std::byte{'X'}; }), 100, "bad magic");
  check_rejected(damaged(good8, [](payload_t& p) { p[4] = std::byte{5}; }), 100, "5 bits per code (8 or 4)");
  check_rejected(damaged(good8, [](payload_t& p) { p[4] = std::byte{4}; }), 100, "the header implies 90");
  check_rejected(damaged(good8, [](payload_t& p) { p[5] = std::byte{1}; }), 100, "unknown scale type 1");
  check_rejected(damaged(good8, [](payload_t& p) { p[7] = std::byte{1}; }), 100, "reserved header bytes");
  check_rejected(damaged(good8, [](payload_t& p) { p[21] = std::byte{1}; }), 100, "reserved header bytes");
  check_rejected(damaged(good8, [](payload_t& p) { wr<uint32_t>(p, 16, 0); }), 100, "block of 0 elements");
  check_rejected(damaged(good8, [](payload_t& p) { wr<uint32_t>(p, 16, 70000); }), 100, "block of 70000 elements");
  check_rejected(damaged(good8, [](payload_t& p) { wr<uint64_t>(p, 8, ~uint64_t{0}); }), 100, "more than 2^64");
  check_rejected(damaged(good8, [](payload_t& p) { wr<float>(p, 28, -1.0f); }), 100, "scale of block 1 is negative");
  check_rejected(damaged(good8, [](payload_t& p) { wr<float>(p, 24, -0.0f); }), 100, "scale of block 0 is negative");
  check_rejected(damaged(good8, [](payload_t& p) { wr<float>(p, 32, inf_f); }), 100, "scale of block 2 is infinite");
  check_rejected(damaged(good8, [](payload_t& p) { wr<float>(p, 36, nan_f); }), 100, "scale of block 3 is NaN");
  check_rejected(damaged(good8, [&](payload_t& p) { p[codes8 + 57] = std::byte{0x80}; }), 100,
                 "element 57 has the code -128");
  check_rejected(damaged(good4, [&](payload_t& p) { p[codes4 + 20] = std::byte{0x83}; }), 100,
                 "element 41 has the code -8");
  check_rejected(damaged(good4, [&](payload_t& p) { p[codes4 + 3] = std::byte{0x38}; }), 100,
                 "element 6 has the code -8");
  // Each codec refuses the other's payload.
  std::vector<float> d(100, 42.0f);
  const std::string err = codec_of(codec_kind::int8).decode(good4, d).error();
  CHECK(err.find("int8 payload: carries 4-bit codes, not 8") != std::string::npos);
  CHECK_FALSE(codec_of(codec_kind::int4).decode(good8, d).ok());
  CHECK(d == std::vector<float>(100, 42.0f));
  uint64_t n = 0;
  CHECK(quant_payload_elements(good8, n));
  CHECK(n == 100);
  CHECK_FALSE(quant_payload_elements(payload_t(good8.begin(), good8.begin() + 8), n));
}

TEST_CASE("quant: the codecs in the table, and AdaTopK's quantizing levels") {
  const codec& i8 = codec_of(codec_kind::int8);
  const codec& i4 = codec_of(codec_kind::int4);
  CHECK(i8.name() == "int8");
  CHECK(i4.name() == "int4");
  CHECK(codec_on_wire(3) == &i8);
  CHECK(codec_on_wire(4) == &i4);
  codec_settings run;
  run.scale_block = 128;
  const codec_settings s = i8.at(0.1, run);  // no level of its own
  CHECK(s.kind == codec_kind::int8);
  CHECK(s.scale_block == 128);
  CHECK(s.keep_ratio == int8_level);
  CHECK(i8.payload_bytes(4096, s) == 24 + 32 * 4 + 4096);
  CHECK(i4.payload_bytes(4096, i4.at(1, run)) == 24 + 32 * 4 + 2048);
  CHECK(i8.encodes(4096, s));
  CHECK_FALSE(i8.encodes(4, s));  // 24 + 4 + 4 bytes is more than 16: raw goes
  CHECK(i8.describe(s) == "int8 /128");
  // The levels sit between topk's keep-all (f16) and every top-k ratio, int8 above int4.
  CHECK(int8_level < keep_all_ratio);
  CHECK(int4_level < int8_level);
  CHECK(int4_level > 0.5);
  const codec& ada = codec_of(codec_kind::adatopk);
  CHECK(ada.at(int8_level, run) == s);
  CHECK(ada.at(int4_level, run).kind == codec_kind::int4);
  CHECK(ada.at(keep_all_ratio, run).kind == codec_kind::adatopk);
  CHECK(ada.at(0.5, run).kind == codec_kind::adatopk);
}

TEST_CASE("quant: error feedback through edge_encoder carries the rounding into the next tensor") {
  // A gradient sent 50 times: with error feedback the receiver's running sum stays within one
  // rounding step of the true sum; without it the same rounding error adds up every time.
  const auto g = normal_data(1000, 77);
  for (const codec_kind kind : {codec_kind::int8, codec_kind::int4}) {
    codec_settings s = codec_of(kind).at(1, {});
    edge_encoder plain(s);
    s.error_feedback = true;
    edge_encoder fed(s);
    std::vector<double> truth(g.size()), sum_plain(g.size()), sum_fed(g.size());
    payload_t p;
    std::vector<float> y(g.size());
    for (int step = 0; step < 50; ++step) {
      plain.encode(g, 0, p);
      REQUIRE(decode_quant(p, y).ok());
      for (size_t i = 0; i < g.size(); ++i) sum_plain[i] += y[i];
      fed.encode(g, 0, p);
      REQUIRE(decode_quant(p, y).ok());
      for (size_t i = 0; i < g.size(); ++i) sum_fed[i] += y[i], truth[i] += g[i];
    }
    double err_plain = 0, err_fed = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      err_plain = std::max(err_plain, std::fabs(sum_plain[i] - truth[i]));
      err_fed = std::max(err_fed, std::fabs(sum_fed[i] - truth[i]));
    }
    CAPTURE(to_string(kind));
    CAPTURE(err_plain);
    CAPTURE(err_fed);
    CHECK(err_fed * 10 < err_plain);
    // The residual never exceeds about one step of the largest scale (absmax of g + residual).
    CHECK(err_fed <= 2 * 4.0 / (kind == codec_kind::int8 ? 127 : 7));
  }
}

}  // namespace fusion
