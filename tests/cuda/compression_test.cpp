// The CUDA top-k encoder against the CPU one: byte-identical payloads for random tensors of many
// sizes, blocks, ratios and value types, with heavy ties, signed zeros, subnormals, infinities,
// NaNs and values on the f16/bf16 rounding boundaries. Without a device every case that needs
// one prints "skipped: ..." (FUSION_GPU_OR_SKIP).
#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/codec.hpp"
#include "compression/codec_cuda.hpp"
#include "compression/topk_cuda.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {
namespace {

// Values drawn from a few magnitudes with both signs: most elements tie with many others.
std::vector<float> tied_values(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> level(0, 7), sign(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = (sign(rng) ? -1.0f : 1.0f) * 0.25f * float(level(rng));
  return v;
}

std::vector<float> uniform_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Any 32-bit pattern: NaNs with payloads, infinities, subnormals, huge and tiny values.
std::vector<float> random_bits(size_t n, std::mt19937& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  return v;
}

// Values near the conversion edges: f16 overflow (65504, 65520), f16 subnormals and the
// smallest ones, exact ties of f16 and bf16 rounding, signed zeros, infinities, NaN.
std::vector<float> edge_values(size_t n, std::mt19937& rng) {
  const float specials[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 70000.0f,
                            5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f, 6.097555e-5f,
                            1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::max()};
  std::uniform_int_distribution<size_t> pick(0, std::size(specials) - 1);
  std::uniform_int_distribution<int> coin(0, 3);
  std::vector<float> v(n);
  for (auto& x : v) {
    // Half specials, half random bits on the f16/bf16 half-way points (low mantissa bits
    // exactly 0x1000 or 0x8000).
    uint32_t b = static_cast<uint32_t>(rng());
    switch (coin(rng)) {
      case 0: b = (b & ~0x1fffu) | 0x1000u; break;
      case 1: b = (b & ~0xffffu) | 0x8000u; break;
      default: x = specials[pick(rng)]; continue;
    }
    x = std::bit_cast<float>(b);
  }
  return v;
}

// Encodes `host` on the GPU and on the CPU and requires the same bytes.
void check_parity(backend& g, const std::vector<float>& host, double ratio, value_type vt, uint32_t block,
                  uint32_t value_block = quant_default_block) {
  INFO("n " << host.size() << ", ratio " << ratio << ", values " << to_string(vt) << ", block " << block
            << ", value block " << value_block);
  std::vector<std::byte> want, got;
  encode_topk(host, ratio, vt, block, want, value_block);
  const tensor dev = g.upload(tensor::from({int64_t(host.size())}, host));
  encode_topk_cuda(dev.f32(), host.size(), ratio, vt, block, got, value_block);
  REQUIRE(got.size() == want.size());
  size_t first_diff = 0;
  while (first_diff < got.size() && got[first_diff] == want[first_diff]) ++first_diff;
  CHECK_MESSAGE(first_diff == got.size(), "payloads differ first at byte " << first_diff << " of " << got.size());
  // The payload decodes (the CPU decoder validates everything).
  std::vector<float> dense(host.size());
  CHECK(decode_topk(got, dense).ok());
}

const value_type all_types[] = {value_type::f32, value_type::f16, value_type::bf16};

}  // namespace

TEST_CASE("cuda topk: arguments are checked before any CUDA call") {
  std::vector<std::byte> out;
  CHECK(topk_cuda_compiled() == (FUSION_HAVE_CUDA != 0));
  CHECK_THROWS_AS(encode_topk_cuda(nullptr, 16, 0.0, value_type::f16, 8, out), std::invalid_argument);
  CHECK_THROWS_AS(encode_topk_cuda(nullptr, 16, 1.5, value_type::f16, 8, out), std::invalid_argument);
  CHECK_THROWS_AS(encode_topk_cuda(nullptr, 16, 0.5, value_type::f16, 0, out), std::invalid_argument);
  CHECK_THROWS_AS(encode_topk_cuda(nullptr, 16, 0.5, value_type::f16, codec_max_block + 1, out),
                  std::invalid_argument);
  // An empty tensor is the header alone, as on the CPU; no device memory is touched.
  std::vector<std::byte> want;
  encode_topk(std::span<const float>{}, 0.5, value_type::bf16, 64, want);
  encode_topk_cuda(nullptr, 0, 0.5, value_type::bf16, 64, out);
  CHECK(out == want);
}

TEST_CASE("cuda topk: payloads equal encode_topk byte for byte") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(7);
  const size_t sizes[] = {1, 7, 64, 100, 4096, 4097, 10000, 65536 * 2 + 5, 300000};
  const uint32_t blocks[] = {1, 8, 100, 256, 4096, 65536};
  const double ratios[] = {1.0, 0.5, 0.3, 0.1, 0.01, 0.003};
  int cases = 0;
  for (const size_t n : sizes)
    for (const uint32_t block : blocks) {
      // Every size and block; ratios, value types and value kinds rotate so the run stays short.
      const double ratio = ratios[cases % std::size(ratios)];
      const value_type vt = all_types[cases % 3];
      check_parity(g, tied_values(n, rng), ratio, vt, block);
      check_parity(g, uniform_values(n, rng), ratios[(cases + 1) % std::size(ratios)], all_types[(cases + 1) % 3], block);
      check_parity(g, edge_values(n, rng), ratios[(cases + 2) % std::size(ratios)], all_types[(cases + 2) % 3], block);
      ++cases;
    }
  MESSAGE(cases * 3 << " tensors compared");
}

TEST_CASE("cuda topk: every ratio and value type on blocks with ties") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(11);
  for (const double ratio : {1.0, 0.75, 0.5, 0.25, 0.2, 0.125, 0.1, 0.05, 0.01, 1e-4})
    for (const value_type vt : all_types) {
      check_parity(g, tied_values(50000, rng), ratio, vt, 4096);
      check_parity(g, tied_values(20000, rng), ratio, vt, 777);
    }
}

TEST_CASE("cuda topk: all-equal, all-zero and arbitrary bit patterns") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(13);
  for (const value_type vt : all_types) {
    check_parity(g, std::vector<float>(9000, 1.5f), 0.1, vt, 4096);     // ties only: the first k
    check_parity(g, std::vector<float>(9000, 0.0f), 0.3, vt, 1000);
    check_parity(g, std::vector<float>(9000, -0.0f), 0.3, vt, 1000);
    check_parity(g, random_bits(100000, rng), 0.1, vt, 4096);
    check_parity(g, random_bits(70000, rng), 0.5, vt, 65536);
    check_parity(g, edge_values(70000, rng), 0.02, vt, 512);
  }
}

TEST_CASE("cuda topk: a large tensor in full-size blocks") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(17);
  const auto v = uniform_values((size_t(1) << 22) + 123, rng);
  check_parity(g, v, 0.01, value_type::f16, 4096);
  check_parity(g, v, 0.3, value_type::bf16, 65536);
  check_parity(g, v, 1.0, value_type::f32, 65536);
}

TEST_CASE("cuda codecs: every GPU encoder of the table writes what its CPU encoder writes") {
  // Without CUDA no codec has one; with it, topk, adatopk, int8 and int4 do
  // (compression/codec_cuda.hpp).
  auto has_gpu_encoder = [](codec_kind k) { return device_encoder(k) != nullptr; };
  CHECK(has_gpu_encoder(codec_kind::topk) == topk_cuda_compiled());
  CHECK(has_gpu_encoder(codec_kind::adatopk) == topk_cuda_compiled());
  CHECK(has_gpu_encoder(codec_kind::int8) == quant_cuda_compiled());
  CHECK(has_gpu_encoder(codec_kind::int4) == quant_cuda_compiled());
  CHECK_FALSE(has_gpu_encoder(codec_kind::none));
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(19);
  for (const codec* c : all_codecs()) {
    const device_encode_fn encode = device_encoder(c->kind());
    if (!encode) continue;
    for (const codec_settings& s : c->examples()) {
      INFO(c->describe(s) << ", block " << s.block);
      const auto host = uniform_values(10007, rng);
      std::vector<std::byte> want, got;
      c->encode(host, s, want);
      const tensor dev = g.upload(tensor::from({int64_t(host.size())}, host));
      encode(dev.f32(), host.size(), s, got);
      CHECK(got == want);
    }
  }
}

TEST_CASE("cuda topk: int8 values equal encode_topk's, inf and NaN are refused alike") {
  std::vector<std::byte> refused;  // a value block of 0 is refused before any CUDA call
  CHECK_THROWS_AS(encode_topk_cuda(nullptr, 16, 0.5, value_type::int8, 8, refused, 0), std::invalid_argument);
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(23);
  for (const uint32_t value_block : {1u, 5u, 64u, 4096u})
    for (const double ratio : {1.0, 0.5, 0.1, 0.01}) {
      check_parity(g, tied_values(30011, rng), ratio, value_type::int8, 4096, value_block);
      check_parity(g, uniform_values(30011, rng), ratio, value_type::int8, 777, value_block);
      check_parity(g, std::vector<float>(5000, 0.0f), ratio, value_type::int8, 1000, value_block);
    }
  // Huge magnitudes (the scale steps down where 127 * scale would overflow), subnormals.
  std::vector<float> edges(20000);
  for (size_t i = 0; i < edges.size(); ++i)
    edges[i] = (i % 3 == 0 ? std::numeric_limits<float>::max() : std::numeric_limits<float>::denorm_min()) *
               (i % 2 ? -1.0f : 1.0f) * (float(1 + i % 5) / 5);  // not (FLT_MAX * 4) / 5: inf
  check_parity(g, edges, 0.3, value_type::int8, 512, 7);
  // The lowest inf or NaN is named, as the CPU encoder names it.
  auto host = uniform_values(50000, rng);
  host[40000] = std::numeric_limits<float>::infinity();
  host[31234] = std::numeric_limits<float>::quiet_NaN();
  std::string cpu, gpu;
  std::vector<std::byte> out;
  try {
    encode_topk(host, 0.1, value_type::int8, 4096, out);
  } catch (const std::invalid_argument& e) {
    cpu = e.what();
  }
  const tensor dev = g.upload(tensor::from({int64_t(host.size())}, host));
  try {
    encode_topk_cuda(dev.f32(), host.size(), 0.1, value_type::int8, 4096, out);
  } catch (const std::invalid_argument& e) {
    gpu = e.what();
  }
  CHECK(cpu.find("element 31234") != std::string::npos);
  CHECK(gpu == cpu);
}

TEST_CASE("cuda topk: a host pointer is refused with the CUDA call named") {
  FUSION_GPU_OR_SKIP(g);
  (void)g;
  std::vector<float> host(100, 1.0f);
  std::vector<std::byte> out;
  try {
    encode_topk_cuda(host.data(), host.size(), 0.5, value_type::f16, 64, out);
    FAIL("a host pointer was accepted");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cudaPointerGetAttributes") != std::string::npos);
  }
}

}  // namespace fusion::test
