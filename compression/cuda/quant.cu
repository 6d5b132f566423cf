// The int8 / int4 encoder on the GPU (compression/quant_cuda.hpp): the payload of encode_quant
// (compression/quant.cpp), byte for byte, from a tensor in device memory.
//
// Two kernels on the legacy default stream, the header written on the host:
//   1. scales: one warp per codec block (grid-stride beyond the grid cap) takes the integer max
//      of the bit patterns with the sign cleared, flags a block that holds inf or NaN (the
//      lowest such block wins, atomicMin) and writes scale = absmax / Q (__fdiv_rn: the CPU's
//      correctly rounded division; one step lower where Q * scale would overflow, as the CPU);
//   2. codes: one thread per int8 code, or per int4 byte (two elements, which may lie in two
//      blocks): roundeven(__fdiv_rn(x, scale)) clamped to +-Q, as the CPU does.
// Both kernels write one device buffer laid out like the payload after its header; it is copied
// to the host once, with the flag.
#ifndef FUSION_HAVE_CUDA
#define FUSION_HAVE_CUDA 1  // this file is compiled only when the CUDA toolchain is
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "compression/cuda/check.cuh"
#include "compression/quant_cuda.hpp"

namespace fusion {

namespace {

constexpr int threads = 256;
constexpr uint64_t max_grid = 1u << 16;
constexpr uint32_t abs_mask = 0x7fffffffu, inf_bits = 0x7f800000u;
constexpr unsigned long long no_block = ~0ull;

__global__ void __launch_bounds__(threads) scale_kernel(const float* __restrict__ x, uint64_t n, uint32_t block,
                                                        float qmax, float* __restrict__ scales,
                                                        unsigned long long* __restrict__ bad_block) {
  const unsigned lane = threadIdx.x & 31u;
  const uint64_t warps = uint64_t(gridDim.x) * (threads / 32);
  const uint64_t blocks = (n + block - 1) / block;
  for (uint64_t b = uint64_t(blockIdx.x) * (threads / 32) + (threadIdx.x >> 5); b < blocks; b += warps) {
    const uint64_t start = b * block;
    const uint32_t len = static_cast<uint32_t>(min(uint64_t(block), n - start));
    uint32_t m = 0;
    for (uint32_t j = lane; j < len; j += 32) m = max(m, __float_as_uint(x[start + j]) & abs_mask);
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) {
      if (m >= inf_bits) atomicMin(bad_block, static_cast<unsigned long long>(b));
      // As the CPU's scale_of: one step lower where Q * scale would overflow.
      const float scale = __fdiv_rn(__uint_as_float(m), qmax);
      scales[b] = isinf(__fmul_rn(scale, qmax)) ? nextafterf(scale, 0.0f) : scale;
    }
  }
}

__device__ inline int quantize_one(float x, float scale, float qmax) {
  if (scale == 0.0f) return 0;
  return __float2int_rn(fminf(fmaxf(rintf(__fdiv_rn(x, scale)), -qmax), qmax));  // integral: exact
}

__global__ void __launch_bounds__(threads) code_kernel(const float* __restrict__ x, uint64_t n, uint32_t block,
                                                       unsigned bits, float qmax, const float* __restrict__ scales,
                                                       unsigned char* __restrict__ codes) {
  const uint64_t stride = uint64_t(gridDim.x) * threads;
  if (bits == 8) {
    for (uint64_t i = uint64_t(blockIdx.x) * threads + threadIdx.x; i < n; i += stride)
      codes[i] = static_cast<unsigned char>(static_cast<signed char>(quantize_one(x[i], scales[i / block], qmax)));
    return;
  }
  const uint64_t bytes = n / 2 + n % 2;
  for (uint64_t j = uint64_t(blockIdx.x) * threads + threadIdx.x; j < bytes; j += stride) {
    const uint64_t i = 2 * j;
    const unsigned lo = static_cast<unsigned>(quantize_one(x[i], scales[i / block], qmax)) & 0x0fu;
    const unsigned hi =
        i + 1 < n ? static_cast<unsigned>(quantize_one(x[i + 1], scales[(i + 1) / block], qmax)) & 0x0fu : 0u;
    codes[j] = static_cast<unsigned char>(lo | (hi << 4));
  }
}

unsigned grid_for(uint64_t work, uint64_t per_block) {
  return static_cast<unsigned>(std::clamp<uint64_t>((work + per_block - 1) / per_block, 1, max_grid));
}

}  // namespace

void encode_quant_cuda(const float* x, uint64_t n, unsigned bits, uint32_t block, std::vector<std::byte>& out) {
  if (bits != 8 && bits != 4) throw std::invalid_argument("quant: " + std::to_string(bits) + " bits per code (8 or 4)");
  const std::string name = bits == 8 ? "int8" : "int4";
  if (block < 1 || block > codec_max_block)
    throw std::invalid_argument(name + ": block of " + std::to_string(block) + " elements (1.." +
                                std::to_string(codec_max_block) + ")");
  const uint64_t total = quant_payload_bytes(n, bits, block);
  const uint64_t blocks = n / block + (n % block ? 1 : 0);
  out.assign(total, std::byte{0});
  unsigned char header[quant_header_bytes] = {'F', 'Z', 'Q', '1'};
  header[4] = static_cast<unsigned char>(bits);
  for (int i = 0; i < 8; ++i) header[8 + i] = static_cast<unsigned char>(n >> (8 * i));
  for (int i = 0; i < 4; ++i) header[16 + i] = static_cast<unsigned char>(block >> (8 * i));
  std::memcpy(out.data(), header, quant_header_bytes);
  if (n == 0) return;

  codec_cuda::use_device_of(x, "encode_quant_cuda");

  // The body (scales, then codes) and, 8-aligned after it, the flag of the first bad block.
  const uint64_t body = total - quant_header_bytes, flag_at = (body + 7) / 8 * 8;
  codec_cuda::device_buffer buf;
  CODEC_CUDA_CHECK(cudaMalloc(&buf.p, flag_at + sizeof(unsigned long long)));
  auto* base = static_cast<unsigned char*>(buf.p);
  auto* flag = reinterpret_cast<unsigned long long*>(base + flag_at);
  CODEC_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), cudaStreamLegacy));
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  auto* scales = reinterpret_cast<float*>(base);
  scale_kernel<<<grid_for(blocks, threads / 32), threads, 0, cudaStreamLegacy>>>(x, n, block, qmax, scales, flag);
  CODEC_CUDA_CHECK(cudaGetLastError());
  const uint64_t work = bits == 8 ? n : n / 2 + n % 2;
  code_kernel<<<grid_for(work, threads), threads, 0, cudaStreamLegacy>>>(x, n, block, bits, qmax, scales,
                                                                          base + blocks * sizeof(float));
  CODEC_CUDA_CHECK(cudaGetLastError());
  unsigned long long bad = no_block;
  CODEC_CUDA_CHECK(
      cudaMemcpyAsync(out.data() + quant_header_bytes, base, body, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  CODEC_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  CODEC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  if (bad == no_block) return;
  // Name the first inf or NaN of the first bad block, as the CPU encoder does.
  const uint64_t start = bad * block;
  std::vector<float> values(static_cast<size_t>(std::min<uint64_t>(block, n - start)));
  CODEC_CUDA_CHECK(cudaMemcpy(values.data(), x + start, values.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < values.size(); ++j)
    if (!std::isfinite(values[j]))
      throw std::invalid_argument(quant_non_finite_message(bits, start + j, values[j], block));
  throw std::logic_error(name + ": the GPU flagged block " + std::to_string(bad) + " but its values are finite");
}

}  // namespace fusion
