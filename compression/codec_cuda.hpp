// Which codecs of the table (compression/codec.hpp) have a GPU encoder in this build: the hook
// that keeps CUDA out of the codec interface. A sender whose tensor lives on a GPU asks
// device_encoder() and, when it gets one, encodes there and stages only the payload to the host.
//
// Like compression/topk_cuda.hpp this needs FUSION_HAVE_CUDA (a public compile definition of
// fusion_tensor); the encoders are defined in compression/cuda/ (library
// fusion_compression_cuda, built only with the CUDA toolchain), so without CUDA nothing here
// refers to them and nothing fails to link.
#pragma once

#include "compression/codec.hpp"
#include "compression/quant_cuda.hpp"
#include "compression/topk_cuda.hpp"

namespace fusion {

/// The GPU encoder of the codec of `kind` in this build, or null (no CUDA, or none for it).
inline device_encode_fn device_encoder(codec_kind kind) {
#if FUSION_HAVE_CUDA
  // One line per wire encoding with a CUDA encoder (compression/cuda/).
  switch (codec_of(kind).wire_encoding()) {
    case codec_kind::topk: return &encode_topk_cuda_settings;
    case codec_kind::int8: return &encode_int8_cuda_settings;
    case codec_kind::int4: return &encode_int4_cuda_settings;
    default: break;
  }
#else
  (void)kind;
#endif
  return nullptr;
}

}  // namespace fusion
