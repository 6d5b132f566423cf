// The top-k encoder on the GPU: a GPU node encodes an edge tensor where it lives and stages only
// the payload to the host. Plain C++ (no CUDA headers); defined in compression/cuda/topk.cu,
// which is built (library fusion_compression_cuda) only when the CUDA toolchain is.
//
// Availability follows the pattern of ops/backend.hpp's cuda_compiled(): FUSION_HAVE_CUDA (a
// public compile definition of fusion_tensor, 0 or 1) says whether this build has CUDA code.
// Callers guard calls to encode_topk_cuda with `#if FUSION_HAVE_CUDA` (or test
// topk_cuda_compiled() inside such a guard) and link fusion_compression_cuda when it exists;
// without CUDA the function is declared but defined nowhere, so an unguarded call fails to link
// instead of failing at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compression/topk.hpp"

#ifndef FUSION_HAVE_CUDA
#error "compression/topk_cuda.hpp needs FUSION_HAVE_CUDA (0 or 1): link fusion_tensor, which defines it"
#endif

namespace fusion {

/// Whether this build has the CUDA encoder (false when compiled without CUDA).
inline constexpr bool topk_cuda_compiled() noexcept { return FUSION_HAVE_CUDA != 0; }

/// Encodes `n` floats at device pointer `x` (CUDA memory) into a topk payload in host memory,
/// bit-identical to encode_topk on the same values. Throws std::runtime_error naming the CUDA
/// call on any CUDA error (including `x` not being device memory), std::invalid_argument on a
/// ratio outside (0, 1], a block or value block outside 1..codec_max_block or (int8 values) an inf
/// or NaN element, with encode_topk's message.
///
/// Runs on the legacy default stream of the device that holds `x` (made current on the calling
/// thread) and returns when `out` is filled. Work queued on blocking streams is ordered before it;
/// a caller that wrote `x` on a cudaStreamNonBlocking stream synchronises that stream first.
void encode_topk_cuda(const float* x, uint64_t n, double ratio, value_type values, uint32_t block,
                      std::vector<std::byte>& out, uint32_t value_block = quant_default_block);

/// encode_topk_cuda with a codec's settings (a device_encode_fn for compression/codec_cuda.hpp).
inline void encode_topk_cuda_settings(const float* x, uint64_t n, const codec_settings& s, std::vector<std::byte>& out) {
  encode_topk_cuda(x, n, s.keep_ratio, s.values, s.block, out, s.scale_block);
}

}  // namespace fusion
