// The CUDA int8 / int4 encoder (compression/cuda/quant.cu) against the CPU one: byte-identical
// payloads for many sizes, blocks (odd ones put two blocks in one int4 byte), ties, signed
// zeros, subnormals and huge values; inf and NaN refused with the CPU's message. The table's
// parity case (compression_test.cpp) covers int8 and int4 too. Without a device every case that
// needs one prints "skipped: ..." (FUSION_GPU_OR_SKIP).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/quant_cuda.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {
namespace {

// Normal values, exact ties of the rounding, signed zeros, subnormals, huge and tiny blocks.
std::vector<float> quant_values(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 6), code(-127, 127);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (kind(rng)) {
      case 0: x = (code(rng) + 0.5f) * 0.25f; break;
      case 1: x = -0.0f; break;
      case 2: x = std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x807fffffu); break;
      case 3: x = std::ldexp(static_cast<float>(code(rng)), 110); break;
      default: x = normal(rng);
    }
  }
  return v;
}

void check_quant_parity(backend& g, const std::vector<float>& host, unsigned bits, uint32_t block) {
  INFO("n " << host.size() << ", bits " << bits << ", block " << block);
  std::vector<std::byte> want, got;
  encode_quant(host, bits, block, want);
  const tensor dev = g.upload(tensor::from({int64_t(host.size())}, host));
  encode_quant_cuda(dev.f32(), host.size(), bits, block, got);
  REQUIRE(got.size() == want.size());
  size_t first_diff = 0;
  while (first_diff < got.size() && got[first_diff] == want[first_diff]) ++first_diff;
  CHECK_MESSAGE(first_diff == got.size(), "payloads differ first at byte " << first_diff << " of " << got.size());
}

}  // namespace

TEST_CASE("cuda quant: arguments are checked before any CUDA call") {
  std::vector<std::byte> out, want;
  CHECK(quant_cuda_compiled() == (FUSION_HAVE_CUDA != 0));
  CHECK_THROWS_AS(encode_quant_cuda(nullptr, 16, 6, 64, out), std::invalid_argument);
  CHECK_THROWS_AS(encode_quant_cuda(nullptr, 16, 8, 0, out), std::invalid_argument);
  CHECK_THROWS_AS(encode_quant_cuda(nullptr, 16, 4, codec_max_block + 1, out), std::invalid_argument);
  encode_quant(std::vector<float>{}, 4, 64, want);
  encode_quant_cuda(nullptr, 0, 4, 64, out);  // the header alone; no device memory touched
  CHECK(out == want);
}

TEST_CASE("cuda quant: payloads equal encode_quant byte for byte") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(23);
  for (const size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{65}, size_t{4097}, size_t{300001}})
    for (const uint32_t block : {1u, 5u, 32u, 64u, 100u, 256u, 65536u})
      for (const unsigned bits : {8u, 4u}) check_quant_parity(g, quant_values(n, rng), bits, block);
  check_quant_parity(g, quant_values((size_t(1) << 22) + 3, rng), 8, 64);
  check_quant_parity(g, quant_values((size_t(1) << 22) + 3, rng), 4, 64);
  check_quant_parity(g, std::vector<float>(5000, 0.0f), 4, 64);
}

TEST_CASE("cuda quant: inf and NaN are refused with the CPU encoder's message") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(29);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    auto host = quant_values(10000, rng);
    host[7777] = bad;
    host[9000] = bad;
    std::string want, got;
    std::vector<std::byte> out;
    try {
      encode_quant(host, 8, 64, out);
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    const tensor dev = g.upload(tensor::from({int64_t(host.size())}, host));
    try {
      encode_quant_cuda(dev.f32(), host.size(), 8, 64, out);
    } catch (const std::invalid_argument& e) {
      got = e.what();
    }
    CHECK(!want.empty());
    CHECK(got == want);
  }
}

TEST_CASE("cuda quant: a host pointer is refused with the CUDA call named") {
  FUSION_GPU_OR_SKIP(g);
  (void)g;
  std::vector<float> host(100, 1.0f);
  std::vector<std::byte> out;
  try {
    encode_quant_cuda(host.data(), host.size(), 8, 64, out);
    FAIL("a host pointer was accepted");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cudaPointerGetAttributes") != std::string::npos);
  }
}

}  // namespace fusion::test
