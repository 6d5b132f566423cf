// Top-k with int8 values (compression/topk.hpp, value type 3): the layout read by hand, the
// kept set equal to f32 values', every value within half its run's scale, inf and NaN refused
// by name, damaged payloads refused, and AdaTopK's top-k rungs priced and sent with it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "compression/adaptive.hpp"
#include "compression/quant.hpp"
#include "compression/topk.hpp"
#include "scheduler/compression_plan.hpp"
#include "tests/compression/codec_test_util.hpp"

using namespace fusion;
using namespace fusion::codec_test;

namespace {

std::vector<float> normal_values(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// The value section of block b of a payload, checked against the f32 payload's values: the
// same kept values, each code within half a step of value / scale.
void check_values(const std::vector<float>& x, double ratio, uint32_t block, uint32_t vb) {
  CAPTURE(x.size());
  CAPTURE(ratio);
  CAPTURE(block);
  CAPTURE(vb);
  payload_t q, f;
  encode_topk(x, ratio, value_type::int8, block, q, vb);
  encode_topk(x, ratio, value_type::f32, block, f);
  REQUIRE(q.size() == topk_payload_bytes(x.size(), ratio, value_type::int8, block, vb));
  CHECK(static_cast<uint8_t>(q[4]) == 3);
  CHECK(rd<uint32_t>(q, 28) == vb);
  CHECK(q[5] == f[5]);  // the same index form: it depends on the positions only
  const uint64_t n = x.size(), full = n / block, tail = n % block;
  const uint32_t kf = keep_count(block, ratio), kt = keep_count(static_cast<uint32_t>(tail), ratio);
  const bool bitmap = q[5] == std::byte{1};
  size_t oq = codec_header_bytes, of = codec_header_bytes;
  for (uint64_t b = 0; b < full + (tail ? 1 : 0); ++b) {
    const uint32_t len = b < full ? block : static_cast<uint32_t>(tail), k = b < full ? kf : kt;
    const size_t pos = bitmap ? (len + 7) / 8 : 2 * size_t{k};
    REQUIRE(std::memcmp(q.data() + oq, f.data() + of, pos) == 0);  // the same positions
    const uint32_t runs = (k + vb - 1) / vb;
    const size_t scales = oq + pos, codes = scales + 4 * size_t{runs};
    for (uint32_t j = 0; j < k; ++j) {
      const float v = rd<float>(f, of + pos + 4 * size_t{j});
      const float s = rd<float>(q, scales + 4 * size_t{j / vb});
      const auto c = static_cast<int8_t>(q[codes + j]);
      CHECK(c != -128);
      CHECK(std::abs(static_cast<float>(c) * s - v) <= s * 0.5f * (1 + 1e-6f));
    }
    oq = codes + k;
    of += pos + 4 * size_t{k};
  }
  CHECK(oq == q.size());
  // Decoded: zeros where f32's decode has zeros, kept values within half the largest step.
  std::vector<float> dq(n), df(n);
  REQUIRE(decode_topk(q, dq).ok());
  REQUIRE(decode_topk(f, df).ok());
  float absmax = 0;
  for (const float v : x) absmax = std::max(absmax, std::abs(v));
  for (size_t i = 0; i < n; ++i) {
    if (df[i] == 0.0f) CHECK(dq[i] == 0.0f);
    CHECK(std::abs(dq[i] - df[i]) <= absmax / 254 * (1 + 1e-5f));
  }
}

}  // namespace

TEST_CASE("topk int8: the kept set of f32 values, each value within half its run's step") {
  for (const double ratio : {keep_all_ratio, 0.5, 0.1, 0.01})
    for (const uint32_t block : {1u, 7u, 512u, 4096u})
      for (const uint32_t vb : {1u, 5u, 64u, 4096u}) check_values(normal_values(10007, 3), ratio, block, vb);
  check_values(std::vector<float>(3000, 0.0f), 0.1, 1000, 64);  // zero scales, zero codes
  check_values(normal_values(5000, 5, 1e30f), 0.2, 1000, 16);   // huge magnitudes stay finite
}

TEST_CASE("topk int8: smaller than f16 values by nearly half, the layout's exact bytes") {
  const uint64_t n = 1 << 16;
  for (const double ratio : {0.5, 0.1, 0.01}) {
    const uint64_t i8 = topk_payload_bytes(n, ratio, value_type::int8, 4096, 64);
    const uint64_t h = topk_payload_bytes(n, ratio, value_type::f16, 4096);
    CHECK(i8 < h);
    // per block: the same positions, then ceil(k / 64) scales and k codes instead of 2k bytes
    const uint64_t k = keep_count(4096, ratio), blocks = n / 4096;
    CHECK(h - i8 == blocks * (2 * k - (4 * ((k + 63) / 64) + k)));
  }
  // Every decodable payload fits the bound decoders check first (block 1, value block 1).
  CHECK(topk_payload_bytes(1000, keep_all_ratio, value_type::int8, 1, 1) <= topk_max_payload_bytes(1000));
}

TEST_CASE("topk int8: inf and NaN are refused by name, other value types still carry them") {
  auto x = normal_values(9000, 7);
  x[8001] = inf_f;
  x[5000] = nan_f;
  payload_t p;
  try {
    encode_topk(x, 0.1, value_type::int8, 4096, p);
    FAIL("a NaN was encoded as int8");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "topk: element 5000 of the tensor is NaN (block 1): int8 values carry finite values only");
  }
  CHECK_NOTHROW(encode_topk(x, 0.1, value_type::f16, 4096, p));
  CHECK_THROWS_AS(encode_topk(normal_values(10, 1), 0.5, value_type::int8, 8, p, 0), std::invalid_argument);
  CHECK_THROWS_AS(encode_topk(normal_values(10, 1), 0.5, value_type::int8, 8, p, codec_max_block + 1),
                  std::invalid_argument);
}

TEST_CASE("topk int8: damaged payloads are refused by name and the tensor is left alone") {
  const auto x = normal_values(2000, 11);
  payload_t good;
  encode_topk(x, 0.1, value_type::int8, 1000, good, 16);  // k = 100: 7 scales per block
  std::vector<float> dst(x.size(), 42.0f);
  auto refused = [&](payload_t p, const std::string& words) {
    const status s = decode_topk(p, dst);
    REQUIRE_FALSE(s.ok());
    CHECK_MESSAGE(s.error().find(words) != std::string::npos, s.error());
    CHECK(std::all_of(dst.begin(), dst.end(), [](float v) { return v == 42.0f; }));
  };
  REQUIRE(good[5] == std::byte{1});  // 100 of 1000 kept: a 125-byte bitmap beats 200 bytes of indices
  const size_t scales = codec_header_bytes + 125, codes = scales + 4 * 7;
  payload_t p = good;
  wr<float>(p, scales + 8, nan_f);
  refused(p, "the scale of value block 2 is NaN (block 0)");
  p = good;
  wr<float>(p, scales + 4, -1.0f);
  refused(p, "the scale of value block 1 is negative");
  p = good;
  p[codes + 5] = std::byte{0x80};
  refused(p, "value 5 has the code -128");
  p = good;
  wr<uint32_t>(p, 28, 0);
  refused(p, "value block of 0 values");
  p = good;
  wr<uint32_t>(p, 28, 17);  // another value block: the length no longer matches
  refused(p, "the header implies");
  p = good;
  p[4] = std::byte{4};
  refused(p, "unknown value type 4");
  payload_t h;
  encode_topk(x, 0.1, value_type::f16, 1000, h);
  wr<uint32_t>(h, 28, 64);  // a value block without int8 values: reserved
  refused(h, "reserved header bytes are not zero");
  CHECK(decode_topk(good, dst).ok());
}

TEST_CASE("topk int8: the codec's settings, names, and AdaTopK's top-k rungs") {
  codec_settings run;
  run.values = value_type::int8;
  run.scale_block = 32;
  const codec_settings s = codec_of(codec_kind::topk).at(0.1, run);
  CHECK(codec_of(codec_kind::topk).describe(s) == "topk 10% int8 /32");
  CHECK(codec_of(codec_kind::topk).payload_bytes(50000, s) == topk_payload_bytes(50000, 0.1, value_type::int8, 4096, 32));
  value_type v;
  CHECK(parse_value_type("int8", v));
  CHECK(v == value_type::int8);
  CHECK(value_type_names() == "f32, f16, bf16 or int8");

  // The ladder: keep-all keeps the run's value type; the top-k rungs send int8 values.
  adaptive_settings a;
  CHECK(rung_codec(keep_all_ratio, a).values == value_type::f16);
  for (const double r : {0.5, 0.2, 0.01}) {
    const codec_settings t = rung_codec(r, a);
    CHECK(t.kind == codec_kind::adatopk);
    CHECK(t.values == value_type::int8);
    CHECK(t.scale_block == a.scale_block);
  }
  CHECK(level_name(0.2, a) == "top-k 20% int8 /64");
  // Below int4 from 0.3 down: the top-k rungs are the ladder's smallest.
  const uint64_t n = 1 << 16;
  const auto bytes = [&](double r) {
    const codec_settings t = rung_codec(r, a);
    return codec_of(t.kind).payload_bytes(n, t);
  };
  CHECK(bytes(0.3) < bytes(int4_level));
  CHECK(bytes(0.5) > bytes(int4_level));

  // OP-Fence's cut price and the planner's edge codecs use the same bytes.
  compression_config c;
  c.mode = codec_kind::adatopk;
  c.adaptive.floor_activations = 0.1;
  c.adaptive.floor_gradients = 0.1;
  CHECK(cut_bytes_ratio(c) == doctest::Approx(static_cast<double>(bytes(0.1)) / (4.0 * n)));
  CHECK(cut_bytes_ratio(c) < static_cast<double>(topk_payload_bytes(n, 0.1, value_type::f16, 4096)) / (4.0 * n));
}
