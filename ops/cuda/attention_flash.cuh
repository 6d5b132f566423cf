// Fused (flash) attention on CUDA: tiled, online softmax, no T x T tensor in memory.
// Kernels in ops/cuda/attention_flash.cu; the attention op (ops/cuda/attention.cu) chooses them
// over its cuBLAS path whenever attention_flash_supported says so.
//
// Shape legend: B batch, T time, C channels, NH heads, HS = C / NH head size.
//   qkv (B, T, 3C) -> out (B, T, C); saved lse (B, NH, T): log2 of each query row's softmax
//   denominator of the scaled scores, in base-2 units (scores times log2(e) / sqrt(HS))
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

/// Largest head size the fused kernels take (larger heads use the cuBLAS path).
inline constexpr int64_t attention_flash_max_head = 128;

/// True when the fused kernels run this head size on the current device with `l`'s precision
/// (the shared memory they need fits the device's per-block limit).
bool attention_flash_supported(int64_t head_size, const launch& l);

/// out = softmax(mask(Q K^T / sqrt(HS))) V per batch and head; lse as in the legend.
/// bf16 precision (l.gemm) computes both products on bf16 tensor cores (f32 sums, f32 softmax);
/// fp32 computes them in f32.
void attention_flash_forward_cuda(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                                  int64_t NH, bool causal, const launch& l);

/// dqkv += the gradient of the forward above, given its output `out` and `lse`; `dvec` is
/// scratch of B * NH * T floats. Deterministic: every element is summed by one thread in a
/// fixed order (one kernel for dK and dV over query tiles, one for dQ over key tiles).
void attention_flash_backward_cuda(float* dqkv, float* dvec, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, bool causal,
                                   const launch& l);

}  // namespace fusion::cuda
