// What the CUDA encoders of compression/cuda/ share: the checked CUDA runtime call and a device
// buffer freed on every path out of an encoder.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

// Checks a CUDA runtime call (ops/cuda/common.cuh's CUDA_CHECK, but std::runtime_error: this
// library does not depend on the ops layer).
#define CODEC_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    const cudaError_t codec_cuda_err_ = (expr);                                         \
    if (codec_cuda_err_ != cudaSuccess)                                                 \
      ::fusion::codec_cuda::throw_cuda_error(codec_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace fusion::codec_cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Frees a device buffer on every path out of an encoder (errors ignored: it runs while an
// exception may already be on its way, and at exit the runtime may be gone).
struct device_buffer {
  void* p = nullptr;
  bool pooled = false;  // from cudaMallocAsync on the legacy stream
  ~device_buffer() {
    if (p == nullptr) return;
    const cudaError_t e = pooled ? cudaFreeAsync(p, cudaStreamLegacy) : cudaFree(p);
    if (e != cudaSuccess) (void)cudaGetLastError();
  }
};

// Makes the device that holds `x` current on this thread (actor threads come from a pool) and
// returns it; throws, naming `who`, when `x` is not CUDA memory.
inline int use_device_of(const void* x, const char* who) {
  cudaPointerAttributes attr{};
  CODEC_CUDA_CHECK(cudaPointerGetAttributes(&attr, x));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    throw std::runtime_error(std::string(who) + ": cudaPointerGetAttributes: the input is not CUDA device memory");
  CODEC_CUDA_CHECK(cudaSetDevice(attr.device));
  return attr.device;
}

}  // namespace fusion::codec_cuda

