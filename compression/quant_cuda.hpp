// The int8 / int4 encoder on the GPU: a GPU node quantizes an edge tensor where it lives and
// stages only the payload to the host. Plain C++ (no CUDA headers); defined in
// compression/cuda/quant.cu, built (library fusion_compression_cuda) only with the CUDA
// toolchain. Guard calls as for compression/topk_cuda.hpp (`#if FUSION_HAVE_CUDA`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compression/quant.hpp"

#ifndef FUSION_HAVE_CUDA
#error "compression/quant_cuda.hpp needs FUSION_HAVE_CUDA (0 or 1): link fusion_tensor, which defines it"
#endif

namespace fusion {

/// Whether this build has the CUDA encoder (false when compiled without CUDA).
inline constexpr bool quant_cuda_compiled() noexcept { return FUSION_HAVE_CUDA != 0; }

/// Encodes `n` floats at device pointer `x` (CUDA memory) into a quant payload in host memory,
/// bit-identical to encode_quant on the same values. Throws std::invalid_argument as
/// encode_quant does (bits, block, an inf or NaN element: the same message), and
/// std::runtime_error naming the CUDA call on any CUDA error (including `x` not being device
/// memory). Runs on the legacy default stream of the device that holds `x` and returns when
/// `out` is filled (the stream rules of encode_topk_cuda).
void encode_quant_cuda(const float* x, uint64_t n, unsigned bits, uint32_t block, std::vector<std::byte>& out);

/// encode_quant_cuda with a codec's settings (device_encode_fn of compression/codec_cuda.hpp).
inline void encode_int8_cuda_settings(const float* x, uint64_t n, const codec_settings& s, std::vector<std::byte>& out) {
  encode_quant_cuda(x, n, 8, s.scale_block, out);
}
inline void encode_int4_cuda_settings(const float* x, uint64_t n, const codec_settings& s, std::vector<std::byte>& out) {
  encode_quant_cuda(x, n, 4, s.scale_block, out);
}

}  // namespace fusion
