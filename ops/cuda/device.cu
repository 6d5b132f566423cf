// The CUDA tensor hooks (tensor/device.hpp): allocation, fill and copies of CUDA tensors.
//
// Memory: tensors allocate with cudaMallocAsync / free with cudaFreeAsync on the legacy default
// stream, from the device's default memory pool (kept, not returned to the driver, between
// uses). The legacy stream is ordered after every earlier operation of every blocking stream
// and before every later one, and each backend's stream is a blocking stream: so a buffer is
// only reused after all kernels queued on it have finished, with no host synchronisation.
// Devices without memory pools fall back to cudaMalloc/cudaFree (which synchronise).
//
// Shape legend: n elements (bytes for raw copies).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace fusion::cuda {

namespace {

std::atomic<int> pools_state{-1};  // -1 unknown, 0 cudaMalloc, 1 stream-ordered pools

bool use_pools() {
  int state = pools_state.load(std::memory_order_acquire);
  if (state >= 0) return state == 1;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  state = pools_state.load(std::memory_order_acquire);
  if (state >= 0) return state == 1;
  int dev = 0, supported = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
  if (supported) {
    // Keep freed memory in the pool instead of giving it back at every synchronisation.
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  pools_state.store(supported ? 1 : 0, std::memory_order_release);
  return supported != 0;
}

int hook_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the sticky-free error, report 0
    return 0;
  }
  return n;
}

// Still a std::bad_alloc (device_hooks::alloc's contract), but one that says what ran out: the
// request, the device and what it has left, instead of "std::bad_alloc".
class device_out_of_memory final : public std::bad_alloc {
 public:
  explicit device_out_of_memory(size_t bytes) {
    int dev = 0;
    size_t free_b = 0, total_b = 0;
    (void)cudaGetDevice(&dev);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    constexpr double mib = 1 << 20;
    char buf[200];
    std::snprintf(buf, sizeof buf, "out of GPU memory: %.0f MiB asked of cuda:%d, which has %.0f MiB free of %.0f MiB",
                  bytes / mib, dev, free_b / mib, total_b / mib);
    message_ = buf;
  }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

void* hook_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = use_pools() ? cudaMallocAsync(&p, bytes, cudaStreamLegacy) : cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw device_out_of_memory(bytes);
  }
  CUDA_CHECK(e);
  return p;
}

void hook_free(void* p) noexcept {
  if (p == nullptr) return;
  // Errors are ignored: at process exit the runtime may already be gone (cudaErrorCudartUnloading).
  const cudaError_t e = pools_state.load(std::memory_order_acquire) == 1 ? cudaFreeAsync(p, cudaStreamLegacy)
                                                                         : cudaFree(p);
  if (e != cudaSuccess) (void)cudaGetLastError();
}

void hook_memset_zero(void* p, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy)); }

void hook_fill_f32(float* p, int64_t n, float v) { fill_cuda(p, n, v, cudaStreamLegacy); }

void hook_copy_h2d(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void hook_copy_d2h(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void hook_copy_d2d(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy));
}

device_hooks make_hooks() {
  device_hooks h;
  h.name = "cuda";
  h.device_count = hook_device_count;
  h.alloc = hook_alloc;
  h.free = hook_free;
  h.memset_zero = hook_memset_zero;
  h.fill_f32 = hook_fill_f32;
  h.copy_h2d = hook_copy_h2d;
  h.copy_d2h = hook_copy_d2h;
  h.copy_d2d = hook_copy_d2d;
  return h;
}

const device_hooks the_hooks = make_hooks();

// Registration only stores pointers: no CUDA call runs at static initialisation, so a program
// linked with this library starts on a machine without a driver.
struct hooks_registrar {
  hooks_registrar() { register_device_hooks(device_kind::cuda, &the_hooks); }
} registrar;

}  // namespace

const device_hooks* tensor_hooks() noexcept { return &the_hooks; }

int device_count() noexcept { return hook_device_count(); }

}  // namespace fusion::cuda
