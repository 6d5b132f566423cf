// Fused (flash) attention: forward and backward kernels (ops/cuda/attention_flash.cuh).
//
// Shape legend: B batch, T time, C channels, NH heads, HS head size; D = HS rounded up to 16,
// 32, 64 or 128, the kernels' compile-time width (tile columns HS..D are zero).
// A block has 4 warps and owns 64 rows (queries in forward and dQ, keys in dK/dV); each warp
// owns 16 of them and walks the other side in tiles of 64, so nothing of size T x T exists.
//
// Every product is a warp's 16 x N result in registers, in the layout of the accumulator of the
// m16n8k16 tensor-core instruction: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8,
// columns 8n + 2t and 8n + 2t + 1 of each 8-wide column tile n. Masking, the online softmax and
// the rescaling work on that layout in both precisions; two product shapes do the rest:
//   rr: acc += A B^T, A the warp's 16 rows and B N rows of shared tiles, inner length D;
//   pb: acc += P B, P a 16 x 64 register result (probabilities, dS), B a 64 x D shared tile.
// bf16 (runtime.precision = bf16, compute capability 8.0 and newer): tiles are stored as bf16
// and the products run on mma.sync with f32 sums; P feeds pb straight from registers, since its
// accumulator layout is the instruction's A-operand layout. fp32: tiles in f32, the same
// products as f32 FMAs, P through a per-warp shared scratch.
// Scores are kept in base-2 units (times log2(e) / sqrt(HS)) so the exponentials are exp2f.
#include "ops/cuda/attention_flash.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace fusion::cuda {

namespace {

constexpr int tile = 64, warps = 4, threads = 32 * warps, scratch_ld = tile + 4;
constexpr unsigned full_mask = 0xffffffffu;

template <bool Mma>
struct storage {  // fp32 tiles; a row pad of 4 floats keeps the 8 rows a warp reads in 8 banks
  using type = float;
  static constexpr int pad = 4;
};
template <>
struct storage<true> {  // bf16 tiles; a pad of 8 does the same for the 32-bit fragment loads
  using type = __nv_bfloat16;
  static constexpr int pad = 8;
};

template <bool Mma, int D>
struct geom {
  using elem = typename storage<Mma>::type;
  static constexpr int ld = D + storage<Mma>::pad;
  static constexpr size_t tile_bytes = size_t(tile) * ld * sizeof(elem);
  static constexpr size_t scratch_bytes = Mma ? 0 : size_t(warps) * 16 * scratch_ld * sizeof(float);
  static constexpr size_t forward_smem = 3 * tile_bytes + scratch_bytes;
  static constexpr size_t backward_smem = 4 * tile_bytes + 2 * tile * sizeof(float) + scratch_bytes;
};

__device__ inline void put(float* p, float v) { *p = v; }
__device__ inline void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ inline void put4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ inline void put4(__nv_bfloat16* p, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = u;
}

// Rows [r0, r0 + 64) of one head (HS columns from `src`, rows `src_ld` apart) into a tile,
// zero past row T and past column HS. With `vec` (HS, the row stride and `src` all 16-byte
// aligned) a thread moves float4s, else floats; either way it issues a batch of loads before
// storing any of them, so their latencies overlap instead of adding up.
template <class E, int D, int Ld>
__device__ void load_tile(E* dst, const float* src, int64_t src_ld, int r0, int T, int hs, bool vec) {
  constexpr int batch = 4;  // 16 registers of float4 in flight: more cost occupancy
  if (vec) {
    constexpr int per_row = D / 4, count = tile * per_row / threads;
    static_assert(count % batch == 0 || count < batch, "whole batches of float4");
    constexpr int b_size = count < batch ? count : batch;
#pragma unroll
    for (int b0 = 0; b0 < count; b0 += b_size) {
      float4 v[b_size];
#pragma unroll
      for (int j = 0; j < b_size; ++j) {
        const int i = threadIdx.x + (b0 + j) * threads, r = i / per_row, d = (i % per_row) * 4;
        v[j] = (r0 + r < T && d < hs) ? *reinterpret_cast<const float4*>(src + int64_t(r0 + r) * src_ld + d)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < b_size; ++j) {
        const int i = threadIdx.x + (b0 + j) * threads, r = i / per_row, d = (i % per_row) * 4;
        put4(dst + r * Ld + d, v[j]);
      }
    }
  } else {
    constexpr int count = tile * D / threads;
#pragma unroll
    for (int b0 = 0; b0 < count; b0 += batch) {
      float v[batch];
#pragma unroll
      for (int j = 0; j < batch; ++j) {
        const int i = threadIdx.x + (b0 + j) * threads, r = i / D, d = i % D;
        v[j] = (r0 + r < T && d < hs) ? src[int64_t(r0 + r) * src_ld + d] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < batch; ++j) {
        const int i = threadIdx.x + (b0 + j) * threads;
        put(dst + (i / D) * Ld + i % D, v[j]);
      }
    }
  }
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ inline uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
__device__ inline uint32_t pair_at(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// c += A B for one 16 x 8 x 16 tile: a0..a3 hold A (rows g, g+8; columns 2t.., 2t+8..), b0, b1
// hold B (rows 2t.., 2t+8..; column g), two bf16 per register, the lower index in the low half.
__device__ inline void mma_16x8x16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                   uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host never selects bf16 tiles below compute capability 8.0
#endif
}

__device__ inline float dot4(float4 x, float4 y) { return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w; }

// acc (16 x N) += A B^T: A the warp's 16 rows, B N rows, both tiles of row stride Ld, length D.
template <bool Mma, int D, int N, class E>
__device__ inline void product_rr(float (&acc)[N / 8][4], const E* a, const E* b) {
  constexpr int ld = geom<Mma, D>::ld;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if constexpr (Mma) {
#pragma unroll
    for (int k = 0; k < D; k += 16) {
      const E* ag = a + g * ld + k + 2 * t;
      const uint32_t a0 = pair_at(ag), a1 = pair_at(ag + 8 * ld), a2 = pair_at(ag + 8), a3 = pair_at(ag + 8 * ld + 8);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const E* bn = b + (8 * n + g) * ld + k + 2 * t;
        mma_16x8x16(acc[n], a0, a1, a2, a3, pair_at(bn), pair_at(bn + 8));
      }
    }
  } else {
    const float* a0 = a + g * ld;
    const float* a1 = a0 + 8 * ld;
#pragma unroll 2
    for (int k = 0; k < D; k += 4) {
      const float4 x0 = *reinterpret_cast<const float4*>(a0 + k), x1 = *reinterpret_cast<const float4*>(a1 + k);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const float4 y0 = *reinterpret_cast<const float4*>(b + (8 * n + 2 * t) * ld + k);
        const float4 y1 = *reinterpret_cast<const float4*>(b + (8 * n + 2 * t + 1) * ld + k);
        acc[n][0] += dot4(x0, y0);
        acc[n][1] += dot4(x0, y1);
        acc[n][2] += dot4(x1, y0);
        acc[n][3] += dot4(x1, y1);
      }
    }
  }
}

// acc (16 x D) += P B: P a 16 x 64 register result, B a 64 x D tile (row stride Ld); `scratch`
// is the warp's 16 x scratch_ld floats (fp32 only).
template <bool Mma, int D, class E>
__device__ inline void product_pb(float (&acc)[D / 8][4], const float (&p)[tile / 8][4], const E* b,
                                  float* scratch) {
  constexpr int ld = geom<Mma, D>::ld;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if constexpr (Mma) {
#pragma unroll
    for (int kk = 0; kk < tile / 16; ++kk) {
      const uint32_t a0 = pack_bf16(p[2 * kk][0], p[2 * kk][1]), a1 = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
      const uint32_t a2 = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
      const uint32_t a3 = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
      const E* bk = b + (16 * kk + 2 * t) * ld + g;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const E* bn = bk + 8 * n;
        mma_16x8x16(acc[n], a0, a1, a2, a3, pack_raw(bn[0], bn[ld]), pack_raw(bn[8 * ld], bn[9 * ld]));
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < tile / 8; ++n) {
      *reinterpret_cast<float2*>(scratch + g * scratch_ld + 8 * n + 2 * t) = make_float2(p[n][0], p[n][1]);
      *reinterpret_cast<float2*>(scratch + (g + 8) * scratch_ld + 8 * n + 2 * t) = make_float2(p[n][2], p[n][3]);
    }
    __syncwarp();
#pragma unroll 4
    for (int k = 0; k < tile; ++k) {
      const float x0 = scratch[g * scratch_ld + k], x1 = scratch[(g + 8) * scratch_ld + k];
      const float* bk = b + k * ld + 2 * t;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const float2 y = *reinterpret_cast<const float2*>(bk + 8 * n);
        acc[n][0] += x0 * y.x;
        acc[n][1] += x0 * y.y;
        acc[n][2] += x1 * y.x;
        acc[n][3] += x1 * y.y;
      }
    }
    __syncwarp();  // the scratch is rewritten by the next call
  }
}

// Column of element (n, c) of a lane's accumulator, and which of its two rows (0: g, 1: g + 8).
__device__ inline int col_of(int n, int c) { return 8 * n + 2 * (threadIdx.x & 3) + (c & 1); }

__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(full_mask, v, 1));
  return fmaxf(v, __shfl_xor_sync(full_mask, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(full_mask, v, 1);
  return v + __shfl_xor_sync(full_mask, v, 2);
}

struct head_args {
  int T, C, NH, hs;
  float scale_log2;  // log2(e) / sqrt(HS)
  bool causal;
  bool vec;  // every tile row starts 16-byte aligned (load_tile)
};

template <bool Mma, int D>
__global__ void __launch_bounds__(threads)
    attention_flash_forward_kernel(float* out, float* lse, const float* qkv, head_args z) {
  using G = geom<Mma, D>;
  using E = typename G::elem;
  extern __shared__ __align__(16) unsigned char smem[];
  E* qs = reinterpret_cast<E*>(smem);
  E* ks = qs + tile * G::ld;
  E* vs = ks + tile * G::ld;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  float* scratch = reinterpret_cast<float*>(vs + tile * G::ld) + warp * 16 * scratch_ld;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * tile;  // the longest causal rows start first
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t ld3 = 3 * int64_t(z.C);
  const float* base = qkv + int64_t(b) * z.T * ld3 + int64_t(h) * z.hs;
  load_tile<E, D, G::ld>(qs, base, ld3, q0, z.T, z.hs, z.vec);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int end = z.causal ? min(z.T, q0 + tile) : z.T;
  for (int k0 = 0; k0 < end; k0 += tile) {
    __syncthreads();  // the previous tiles are read (and Q is stored, the first time)
    load_tile<E, D, G::ld>(ks, base + z.C, ld3, k0, z.T, z.hs, z.vec);
    load_tile<E, D, G::ld>(vs, base + 2 * int64_t(z.C), ld3, k0, z.T, z.hs, z.vec);
    __syncthreads();
    float s[tile / 8][4] = {};
    product_rr<Mma, D, tile>(s, qs + warp * 16 * G::ld, ks);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = k0 + col_of(n, c);
        const bool visible = col < z.T && !(z.causal && col > row[c >> 1]);
        s[n][c] = visible ? s[n][c] * z.scale_log2 : -INFINITY;
        mx[c >> 1] = fmaxf(mx[c >> 1], s[n][c]);
      }
    float base_of[2], alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = quad_max(mx[i]);
      base_of[i] = mx[i] == -INFINITY ? 0.0f : mx[i];  // a row with nothing visible yet stays 0
      alpha[i] = exp2f(m[i] - base_of[i]);
      m[i] = mx[i];
    }
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[n][c] = exp2f(s[n][c] - base_of[c >> 1]);
        sum[c >> 1] += s[n][c];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + quad_sum(sum[i]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[n][c] *= alpha[c >> 1];
    product_pb<Mma, D>(o, s, vs, scratch);
  }
  float* ob = out + int64_t(b) * z.T * z.C + int64_t(h) * z.hs;
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = row[c >> 1], d = col_of(n, c);
      if (r < z.T && d < z.hs) ob[int64_t(r) * z.C + d] = o[n][c] / l[c >> 1];
    }
  if ((threadIdx.x & 3) == 0)
    for (int i = 0; i < 2; ++i)
      if (row[i] < z.T) lse[(int64_t(b) * z.NH + h) * z.T + row[i]] = m[i] + log2f(l[i]);
}

// dvec[b, h, i] = sum_d dO[b, i, h, d] O[b, i, h, d] (the softmax backward's row term), a warp
// per row.
__global__ void attention_flash_dvec_kernel(float* dvec, const float* dout, const float* out, int64_t rows,
                                            head_args z) {
  const int lane = threadIdx.x & 31;
  const int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t stride = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = first; r < rows; r += stride) {
    const int64_t i = r % z.T, bh = r / z.T, h = bh % z.NH, b = bh / z.NH;
    const int64_t at = (b * z.T + i) * z.C + h * z.hs;
    float acc = 0.0f;
    for (int d = lane; d < z.hs; d += 32) acc += dout[at + d] * out[at + d];
    acc = warp_sum(acc);
    if (lane == 0) dvec[r] = acc;
  }
}

// dK and dV of one 64-key tile, over the query tiles that see it:
//   P^T = exp2(K Q^T scaled - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - dvec),
//   dK += scale dS^T Q.
template <bool Mma, int D>
__global__ void __launch_bounds__(threads)
    attention_flash_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                       const float* dvec, head_args z, float scale) {
  using G = geom<Mma, D>;
  using E = typename G::elem;
  extern __shared__ __align__(16) unsigned char smem[];
  E* ks = reinterpret_cast<E*>(smem);
  E* vs = ks + tile * G::ld;
  E* qs = vs + tile * G::ld;
  E* dos = qs + tile * G::ld;
  float* lse_s = reinterpret_cast<float*>(dos + tile * G::ld);
  float* dvec_s = lse_s + tile;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  float* scratch = dvec_s + tile + warp * 16 * scratch_ld;
  const int k0 = blockIdx.x * tile;  // the first key tiles see the most queries and start first
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t ld3 = 3 * int64_t(z.C);
  const float* base = qkv + int64_t(b) * z.T * ld3 + int64_t(h) * z.hs;
  const float* dbase = dout + int64_t(b) * z.T * z.C + int64_t(h) * z.hs;
  const float* lse_bh = lse + (int64_t(b) * z.NH + h) * z.T;
  const float* dvec_bh = dvec + (int64_t(b) * z.NH + h) * z.T;
  load_tile<E, D, G::ld>(ks, base + z.C, ld3, k0, z.T, z.hs, z.vec);
  load_tile<E, D, G::ld>(vs, base + 2 * int64_t(z.C), ld3, k0, z.T, z.hs, z.vec);
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int q0 = z.causal ? k0 : 0; q0 < z.T; q0 += tile) {
    __syncthreads();
    load_tile<E, D, G::ld>(qs, base, ld3, q0, z.T, z.hs, z.vec);
    load_tile<E, D, G::ld>(dos, dbase, z.C, q0, z.T, z.hs, z.vec);
    for (int i = threadIdx.x; i < tile; i += threads) {
      const bool in = q0 + i < z.T;
      lse_s[i] = in ? lse_bh[q0 + i] : 0.0f;
      dvec_s[i] = in ? dvec_bh[q0 + i] : 0.0f;
    }
    __syncthreads();
    float p[tile / 8][4] = {};
    product_rr<Mma, D, tile>(p, ks + warp * 16 * G::ld, qs);
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int q = q0 + col_of(n, c);
        const bool visible = q < z.T && !(z.causal && q < key[c >> 1]);
        p[n][c] = visible ? exp2f(p[n][c] * z.scale_log2 - lse_s[q - q0]) : 0.0f;
      }
    product_pb<Mma, D>(dv, p, dos, scratch);
    float ds[tile / 8][4] = {};
    product_rr<Mma, D, tile>(ds, vs + warp * 16 * G::ld, dos);
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) ds[n][c] = p[n][c] * (ds[n][c] - dvec_s[col_of(n, c)]);
    product_pb<Mma, D>(dk, ds, qs, scratch);
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = key[c >> 1], d = col_of(n, c);
      if (r >= z.T || d >= z.hs) continue;
      float* at = dqkv + (int64_t(b) * z.T + r) * ld3 + int64_t(h) * z.hs + d;
      at[z.C] += scale * dk[n][c];
      at[2 * int64_t(z.C)] += dv[n][c];
    }
}

// dQ of one 64-query tile over the key tiles it sees: P as in forward (from lse),
// dP = dO V^T, dS = P (dP - dvec), dQ += scale dS K.
template <bool Mma, int D>
__global__ void __launch_bounds__(threads)
    attention_flash_backward_q_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                      const float* dvec, head_args z, float scale) {
  using G = geom<Mma, D>;
  using E = typename G::elem;
  extern __shared__ __align__(16) unsigned char smem[];
  E* qs = reinterpret_cast<E*>(smem);
  E* dos = qs + tile * G::ld;
  E* ks = dos + tile * G::ld;
  E* vs = ks + tile * G::ld;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  float* scratch = reinterpret_cast<float*>(vs + tile * G::ld) + 2 * tile + warp * 16 * scratch_ld;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * tile;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t ld3 = 3 * int64_t(z.C);
  const float* base = qkv + int64_t(b) * z.T * ld3 + int64_t(h) * z.hs;
  load_tile<E, D, G::ld>(qs, base, ld3, q0, z.T, z.hs, z.vec);
  load_tile<E, D, G::ld>(dos, dout + int64_t(b) * z.T * z.C + int64_t(h) * z.hs, z.C, q0, z.T, z.hs, z.vec);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float row_lse[2], row_dvec[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t at = (int64_t(b) * z.NH + h) * z.T + row[i];
    row_lse[i] = row[i] < z.T ? lse[at] : 0.0f;
    row_dvec[i] = row[i] < z.T ? dvec[at] : 0.0f;
  }
  float dq[D / 8][4] = {};
  const int end = z.causal ? min(z.T, q0 + tile) : z.T;
  for (int k0 = 0; k0 < end; k0 += tile) {
    __syncthreads();
    load_tile<E, D, G::ld>(ks, base + z.C, ld3, k0, z.T, z.hs, z.vec);
    load_tile<E, D, G::ld>(vs, base + 2 * int64_t(z.C), ld3, k0, z.T, z.hs, z.vec);
    __syncthreads();
    float p[tile / 8][4] = {};
    product_rr<Mma, D, tile>(p, qs + warp * 16 * G::ld, ks);
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = k0 + col_of(n, c), r = row[c >> 1];
        const bool visible = r < z.T && col < z.T && !(z.causal && col > r);
        p[n][c] = visible ? exp2f(p[n][c] * z.scale_log2 - row_lse[c >> 1]) : 0.0f;
      }
    float ds[tile / 8][4] = {};
    product_rr<Mma, D, tile>(ds, dos + warp * 16 * G::ld, vs);
#pragma unroll
    for (int n = 0; n < tile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) ds[n][c] = p[n][c] * (ds[n][c] - row_dvec[c >> 1]);
    product_pb<Mma, D>(dq, ds, ks, scratch);
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = row[c >> 1], d = col_of(n, c);
      if (r < z.T && d < z.hs) dqkv[(int64_t(b) * z.T + r) * ld3 + int64_t(h) * z.hs + d] += scale * dq[n][c];
    }
}

// ---- host side ---------------------------------------------------------------------------

int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

int device_attribute(cudaDeviceAttr what) {
  int v = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&v, what, current_device()));
  return v;
}

// Tensor-core tiles where the precision asks for them and the device has bf16 mma.sync.
bool tensor_cores(const launch& l) {
  return l.gemm == gemm_precision::bf16 && device_attribute(cudaDevAttrComputeCapabilityMajor) >= 8;
}

int width_of(int64_t hs) { return hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : 128; }

// Calls f(bool_constant<Mma>, int_constant<D>) for the run-time choice.
template <class F>
void dispatch(bool mma, int64_t hs, F&& f) {
  auto with_width = [&](auto m) {
    switch (width_of(hs)) {
      case 16: return f(m, std::integral_constant<int, 16>{});
      case 32: return f(m, std::integral_constant<int, 32>{});
      case 64: return f(m, std::integral_constant<int, 64>{});
      default: return f(m, std::integral_constant<int, 128>{});
    }
  };
  return mma ? with_width(std::true_type{}) : with_width(std::false_type{});
}

template <class Kernel>
void allow_smem(Kernel k, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// `a` and `b`: the tensors the kernels read tiles of (qkv; dout in backward).
head_args args_of(int64_t T, int64_t C, int64_t NH, bool causal, const float* a, const float* b) {
  const char* who = "attention";
  const int64_t hs = C / NH;
  return {cpu::blas_int(T, who),
          cpu::blas_int(3 * C, who) / 3,
          cpu::blas_int(NH, who),
          cpu::blas_int(hs, who),
          static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(hs))),
          causal,
          hs % 4 == 0 && C % 4 == 0 && aligned16(a) && aligned16(b)};
}

dim3 grid_of(const head_args& z, int64_t B) {
  return dim3(static_cast<unsigned>((z.T + tile - 1) / tile), static_cast<unsigned>(z.NH),
              static_cast<unsigned>(cpu::blas_int(B, "attention")));
}

}  // namespace

bool attention_flash_supported(int64_t head_size, const launch& l) {
  if (head_size < 1 || head_size > attention_flash_max_head) return false;
  size_t need = 0;
  dispatch(tensor_cores(l), head_size, [&](auto m, auto d) {
    using G = geom<decltype(m)::value, decltype(d)::value>;
    need = std::max(G::forward_smem, G::backward_smem);
  });
  return need <= static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

void attention_flash_forward_cuda(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                                  int64_t NH, bool causal, const launch& l) {
  if (B == 0 || T == 0) return;
  const head_args z = args_of(T, C, NH, causal, qkv, qkv);
  dispatch(tensor_cores(l), z.hs, [&](auto m, auto d) {
    constexpr bool M = decltype(m)::value;
    constexpr int W = decltype(d)::value;
    using G = geom<M, W>;
    auto* k = attention_flash_forward_kernel<M, W>;
    allow_smem(k, G::forward_smem);
    k<<<grid_of(z, B), threads, G::forward_smem, l.stream>>>(out, lse, qkv, z);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_flash_backward_cuda(float* dqkv, float* dvec, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, bool causal,
                                   const launch& l) {
  if (B == 0 || T == 0) return;
  const head_args z = args_of(T, C, NH, causal, qkv, dout);
  const int64_t rows = B * NH * T;
  attention_flash_dvec_kernel<<<grid_for(rows * 32), block_threads, 0, l.stream>>>(dvec, dout, out, rows, z);
  CUDA_CHECK_LAUNCH();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(z.hs)));
  dispatch(tensor_cores(l), z.hs, [&](auto m, auto d) {
    constexpr bool M = decltype(m)::value;
    constexpr int W = decltype(d)::value;
    using G = geom<M, W>;
    auto* kv = attention_flash_backward_kv_kernel<M, W>;
    allow_smem(kv, G::backward_smem);
    kv<<<grid_of(z, B), threads, G::backward_smem, l.stream>>>(dqkv, dout, qkv, lse, dvec, z, scale);
    CUDA_CHECK_LAUNCH();
    auto* q = attention_flash_backward_q_kernel<M, W>;
    allow_smem(q, G::backward_smem);
    q<<<grid_of(z, B), threads, G::backward_smem, l.stream>>>(dqkv, dout, qkv, lse, dvec, z, scale);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fusion::cuda
