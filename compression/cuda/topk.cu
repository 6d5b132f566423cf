// The top-k encoder on the GPU (compression/topk_cuda.hpp): the payload of encode_topk
// (compression/topk.cpp), byte for byte, from a tensor in device memory.
//
// One CUDA thread block per codec block (grid-stride over blocks beyond the grid cap):
//   1. select: the key of an element is the bit pattern of |x| (an unsigned order equal to the
//      order of magnitudes); a radix select in 4 passes of 8 bits with a shared-memory histogram
//      finds the k-th largest key T and how many elements equal to T are kept (take_eq);
//   2. emit: tiles of blockDim elements in index order; an element is kept when key > T, or key
//      == T and fewer than take_eq equal keys precede it (ties go to the lower index). Block-wide
//      ballot scans give each kept element its rank, i.e. its slot in the ascending position
//      list; positions are written as u16 indices or bitmap bytes, values converted to the
//      payload's value type with the same integer rounding as the CPU;
//   3. int8 values only: step 2 leaves the kept values as f32 in the thread block's scratch
//      row; after a barrier each warp takes runs of `vblock` values: the integer max of their
//      |x| bits, scale = __fdiv_rn(absmax, 127) (one step lower where 127 * scale overflows) and
//      codes rintf(__fdiv_rn(v, scale)) clamped to +-127, as the CPU's int8 kernels. A tensor
//      with inf or NaN is refused before the kernel runs (the lowest such element, found with
//      atomicMin), with the CPU's message.
// The 32-byte header is written on the host. Every block's section has a size known on the host
// (full blocks share k_full; the partial block is last), so each thread block writes its own
// section of one device buffer, copied to the host once.
#ifndef FUSION_HAVE_CUDA
#define FUSION_HAVE_CUDA 1  // this file is compiled only when the CUDA toolchain is
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "compression/cuda/check.cuh"
#include "compression/topk_cuda.hpp"

namespace fusion {

namespace {

constexpr int max_threads = 512;
constexpr int max_warps = max_threads / 32;
// Grid cap: far more blocks than an H100/H200 runs at once; larger tensors stride.
constexpr uint64_t max_grid = 1u << 16;

// What every thread block needs to find its block and its section.
struct topk_layout {
  uint64_t n;
  uint32_t block;
  uint32_t k_full;
  uint32_t k_tail;
  uint32_t value_bytes;  // 4 (f32), 2 (f16, bf16) or 1 (int8 codes)
  uint32_t values;       // value_type as an integer
  uint32_t vblock;       // int8 values: kept values per scale; else 0
  bool bitmap;           // index form 1
  uint64_t full_section; // bytes of one full block's section
};

// ---- conversions: integer round-to-nearest-even, identical on host and device -------------

__host__ __device__ inline uint16_t f32_to_f16_bits(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN: quiet
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs >= 0x38800000u) {                                              // normal in f16
    const uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  // Subnormal in f16: shift the full mantissa into place, rounding to nearest even.
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24 here
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = m & ((1u << shift) - 1u);
  uint32_t h = m >> shift;
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

__host__ __device__ inline uint16_t f32_to_bf16_bits(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN: quiet
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// The selection key: |x| as bits, so unsigned order is magnitude order.
__device__ inline uint32_t magnitude_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Block-wide exclusive rank of a 0/1 flag among the block's threads (thread order); `total`
// receives the block's count. Every thread of the block must call it (blockDim % 32 == 0).
__device__ inline uint32_t block_rank(bool flag, uint32_t* warp_counts, uint32_t& total) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const uint32_t in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  uint32_t before = 0, sum = 0;
  for (unsigned w = 0; w < (blockDim.x >> 5); ++w) {
    const uint32_t c = warp_counts[w];
    before += w < warp ? c : 0;
    sum += c;
  }
  __syncthreads();  // warp_counts is rewritten by the next call
  total = sum;
  return before + in_warp;
}

__device__ inline void store_le(unsigned char* p, uint32_t v, uint32_t bytes) {
  for (uint32_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Scales of the int8 values of a block with k kept values: ceil(k / vblock), 0 without int8.
__host__ __device__ inline uint32_t value_scales(const topk_layout& L, uint32_t k) {
  return L.vblock ? (k + L.vblock - 1) / L.vblock : 0;
}

// Writes the scales and codes of the k f32 values at v (one warp per run of vblock values).
__device__ void quantize_values(const float* v, uint32_t k, uint32_t vblock, unsigned char* vals) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const uint32_t runs = (k + vblock - 1) / vblock;
  unsigned char* codes = vals + 4 * uint64_t(runs);
  const float qmax = 127.0f;
  for (uint32_t r = warp; r < runs; r += warps) {
    const uint32_t start = r * vblock, len = min(vblock, k - start);
    uint32_t m = 0;
    for (uint32_t j = lane; j < len; j += 32) m = max(m, __float_as_uint(v[start + j]) & 0x7fffffffu);
    m = __reduce_max_sync(0xffffffffu, m);
    float scale = __fdiv_rn(__uint_as_float(m), qmax);
    if (isinf(__fmul_rn(scale, qmax))) scale = nextafterf(scale, 0.0f);
    if (lane == 0) store_le(vals + 4 * uint64_t(r), __float_as_uint(scale), 4);
    for (uint32_t j = lane; j < len; j += 32) {
      const int q = scale == 0.0f ? 0 : __float2int_rn(fminf(fmaxf(rintf(__fdiv_rn(v[start + j], scale)), -qmax), qmax));
      codes[start + j] = static_cast<unsigned char>(static_cast<signed char>(q));
    }
  }
}

// The lowest index of an inf or NaN element into *bad (initialised to ~0).
__global__ void first_non_finite_kernel(const float* __restrict__ x, uint64_t n, unsigned long long* bad) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if ((__float_as_uint(x[i]) & 0x7fffffffu) >= 0x7f800000u) atomicMin(bad, static_cast<unsigned long long>(i));
}

__global__ void __launch_bounds__(max_threads) topk_kernel(const float* __restrict__ x, topk_layout L,
                                                           unsigned char* __restrict__ out,
                                                           float* __restrict__ scratch) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_counts[max_warps];
  __shared__ uint32_t chosen_digit, chosen_remaining;
  const uint64_t blocks = (L.n + L.block - 1) / L.block;
  const unsigned tid = threadIdx.x;

  for (uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const uint64_t start = b * L.block;
    const uint32_t len = static_cast<uint32_t>(min(uint64_t(L.block), L.n - start));
    const uint32_t k = len == L.block ? L.k_full : L.k_tail;
    const float* xb = x + start;
    unsigned char* section = out + b * L.full_section;  // the partial block is the last one
    const uint32_t index_bytes = L.bitmap ? (len + 7) / 8 : 2 * k;
    unsigned char* vals = section + index_bytes;
    float* row = L.vblock ? scratch + uint64_t(blockIdx.x) * L.k_full : nullptr;  // int8: f32 values first

    // 1. Radix select of the k-th largest key, most significant digit first: `remaining` is how
    // many of the elements matching `prefix` on the digits done so far are still to be kept.
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (unsigned i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (uint32_t i = tid; i < len; i += blockDim.x) {
        const uint32_t key = magnitude_key(xb[i]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t above = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (above + hist[d] >= remaining) break;
          above += hist[d];
        }
        chosen_digit = static_cast<uint32_t>(d);
        chosen_remaining = remaining - above;
      }
      __syncthreads();
      prefix |= chosen_digit << shift;
      mask |= 0xffu << shift;
      remaining = chosen_remaining;
      __syncthreads();  // chosen_* is rewritten in the next pass
    }
    const uint32_t threshold = prefix, take_eq = remaining;

    // 2. Emit in index order, one tile of blockDim elements at a time.
    uint32_t eq_before = 0, kept_before = 0;
    for (uint32_t t0 = 0; t0 < len; t0 += blockDim.x) {
      const uint32_t i = t0 + tid;
      const bool inside = i < len;
      const float v = inside ? xb[i] : 0.0f;
      const uint32_t key = magnitude_key(v);
      const bool eq = inside && key == threshold;
      uint32_t eq_total = 0, kept_total = 0;
      const uint32_t eq_rank = eq_before + block_rank(eq, warp_counts, eq_total);
      const bool keep = inside && (key > threshold || (eq && eq_rank < take_eq));
      const uint32_t slot = kept_before + block_rank(keep, warp_counts, kept_total);
      if (keep) {
        if (!L.bitmap) store_le(section + 2 * slot, i, 2);
        const uint32_t bits = __float_as_uint(v);
        if (row) {
          row[slot] = v;
        } else {
          const uint32_t w = L.values == 0 ? bits : (L.values == 1 ? f32_to_f16_bits(bits) : f32_to_bf16_bits(bits));
          store_le(vals + uint64_t(slot) * L.value_bytes, w, L.value_bytes);
        }
      }
      if (L.bitmap) {
        // A warp covers 32 consecutive elements starting at a multiple of 8: its ballot is four
        // bitmap bytes, bit i of byte j = element 8j+i.
        const unsigned ballot = __ballot_sync(0xffffffffu, keep);
        if ((tid & 31u) == 0) {
          const uint32_t first = (t0 + tid) / 8;
          for (uint32_t j = 0; j < 4 && first + j < index_bytes; ++j)
            section[first + j] = static_cast<unsigned char>(ballot >> (8 * j));
        }
      }
      eq_before += eq_total;
      kept_before += kept_total;
    }
    if (row) {
      __syncthreads();  // every kept value is in the row
      quantize_values(row, k, L.vblock, vals);
      __syncthreads();  // the row is rewritten for the next block
    }
  }
}

// Bytes of one block's section: positions, then k values (int8: their scales, then codes).
uint64_t section_bytes(const topk_layout& L, uint32_t len, uint32_t k, bool bitmap) {
  if (len == 0) return 0;
  return (bitmap ? (uint64_t(len) + 7) / 8 : 2 * uint64_t(k)) + 4 * uint64_t(value_scales(L, k)) +
         uint64_t(k) * L.value_bytes;
}

}  // namespace

void encode_topk_cuda(const float* x, uint64_t n, double ratio, value_type values, uint32_t block,
                      std::vector<std::byte>& out, uint32_t value_block) {
  if (!(ratio > 0 && ratio <= 1))
    throw std::invalid_argument("encode_topk_cuda: keep ratio " + std::to_string(ratio) + " is outside (0, 1]");
  if (block < 1 || block > codec_max_block)
    throw std::invalid_argument("encode_topk_cuda: block " + std::to_string(block) + " is outside 1.." +
                                std::to_string(codec_max_block));
  if (values != value_type::f32 && values != value_type::f16 && values != value_type::bf16 &&
      values != value_type::int8)
    throw std::invalid_argument("encode_topk_cuda: unknown value type");
  const bool int8 = values == value_type::int8;
  if (int8 && (value_block < 1 || value_block > codec_max_block))
    throw std::invalid_argument("topk: value block of " + std::to_string(value_block) + " values (1.." +
                                std::to_string(codec_max_block) + ")");

  // The layout, from the same host functions the CPU encoder uses.
  topk_layout L{};
  L.n = n;
  L.block = block;
  L.values = static_cast<uint32_t>(values);
  L.value_bytes = values == value_type::f32 ? 4 : (int8 ? 1 : 2);
  L.vblock = int8 ? value_block : 0;
  const uint32_t tail = static_cast<uint32_t>(n % block);
  const uint64_t full_blocks = n / block;
  L.k_full = keep_count(block, ratio);
  L.k_tail = tail == 0 ? 0 : keep_count(tail, ratio);
  auto total_for = [&](bool bitmap) {
    return codec_header_bytes + full_blocks * section_bytes(L, block, L.k_full, bitmap) +
           section_bytes(L, tail, L.k_tail, bitmap);
  };
  const uint64_t total = topk_payload_bytes(n, ratio, values, block, value_block);
  L.bitmap = total_for(true) < total_for(false);
  L.full_section = section_bytes(L, block, L.k_full, L.bitmap);
  if (total_for(L.bitmap) != total)
    throw std::logic_error("encode_topk_cuda: layout of " + std::to_string(total_for(L.bitmap)) +
                           " bytes disagrees with topk_payload_bytes " + std::to_string(total));

  out.assign(total, std::byte{0});
  unsigned char header[codec_header_bytes] = {'F', 'Z', 'K', '1'};
  header[4] = static_cast<unsigned char>(values);
  header[5] = L.bitmap ? 1 : 0;
  for (int i = 0; i < 8; ++i) header[8 + i] = static_cast<unsigned char>(n >> (8 * i));
  for (int i = 0; i < 4; ++i) {
    header[16 + i] = static_cast<unsigned char>(block >> (8 * i));
    header[20 + i] = static_cast<unsigned char>(L.k_full >> (8 * i));
    header[24 + i] = static_cast<unsigned char>(L.k_tail >> (8 * i));
    header[28 + i] = static_cast<unsigned char>(L.vblock >> (8 * i));
  }
  std::memcpy(out.data(), header, codec_header_bytes);
  if (n == 0) return;

  const int device = codec_cuda::use_device_of(x, "encode_topk_cuda");
  int pools = 0;
  CODEC_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));

  // Full warps (the ballot scans need them), no more threads than a block has elements.
  const int threads = static_cast<int>(std::clamp<uint32_t>((block + 31) / 32 * 32, 32, max_threads));
  const uint64_t blocks = full_blocks + (tail != 0 ? 1 : 0);
  const unsigned grid = static_cast<unsigned>(std::min(blocks, max_grid));
  // The body and, for int8 values, 8-aligned after it the non-finite flag and a row of k_full
  // f32 values per thread block.
  const uint64_t body = total - codec_header_bytes, flag_at = (body + 7) / 8 * 8;
  const uint64_t bytes = int8 ? flag_at + 8 + uint64_t(grid) * L.k_full * sizeof(float) : body;
  codec_cuda::device_buffer buf;
  buf.pooled = pools != 0;
  if (buf.pooled)
    CODEC_CUDA_CHECK(cudaMallocAsync(&buf.p, bytes, cudaStreamLegacy));
  else
    CODEC_CUDA_CHECK(cudaMalloc(&buf.p, bytes));
  auto* base = static_cast<unsigned char*>(buf.p);
  auto* flag = reinterpret_cast<unsigned long long*>(base + flag_at);
  float* scratch = int8 ? reinterpret_cast<float*>(base + flag_at + 8) : nullptr;
  if (int8) {
    CODEC_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), cudaStreamLegacy));
    const unsigned g = static_cast<unsigned>(std::clamp<uint64_t>((n + 255) / 256, 1, max_grid));
    first_non_finite_kernel<<<g, 256, 0, cudaStreamLegacy>>>(x, n, flag);
    CODEC_CUDA_CHECK(cudaGetLastError());
    unsigned long long bad = ~0ull;
    CODEC_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, cudaStreamLegacy));
    CODEC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    if (bad != ~0ull) {
      float v = 0;
      CODEC_CUDA_CHECK(cudaMemcpy(&v, x + bad, sizeof v, cudaMemcpyDeviceToHost));
      throw std::invalid_argument(topk_non_finite_message(bad, v, block));
    }
  }
  topk_kernel<<<grid, threads, 0, cudaStreamLegacy>>>(x, L, base, scratch);
  CODEC_CUDA_CHECK(cudaGetLastError());
  CODEC_CUDA_CHECK(cudaMemcpyAsync(out.data() + codec_header_bytes, buf.p, body, cudaMemcpyDeviceToHost,
                                  cudaStreamLegacy));
  CODEC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

}  // namespace fusion
