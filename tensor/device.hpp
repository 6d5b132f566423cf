// Devices a tensor's storage can live on, and the hook table through which core/ reaches a
// device runtime without including its headers.
//
// core/ stays CUDA-free: the CUDA library (ops/cuda/, target fusion_cuda) fills a device_hooks
// table with plain function pointers (cudaMallocAsync, cudaMemcpy, a fill kernel, ...) and
// registers it for device_kind::cuda, at static initialisation of ops/cuda/backend.cu and again,
// idempotently, from fusion::register_cuda_backend() (ops/backend.hpp). tensor.cpp then calls
// these hooks for every operation on a CUDA tensor; with no hooks registered such operations
// throw std::runtime_error, they never crash.
//
// Ordering contract of the hooks (why it is safe without streams in the tensor API): every hook
// runs on CUDA's legacy default stream, which is ordered after all earlier work of every
// blocking stream of the device and before all later work. The backends create their per-actor
// streams as blocking streams, so a tensor allocated, copied or freed through these hooks never
// races with kernels that an op queued on an actor's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fusion {

/// The one parser of device names: "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N (0 <= N <= 1024).
/// Throws std::runtime_error "bad device 'X' (use cpu, cuda or cuda:N, e.g. cuda:0)".
int cuda_index_of(const std::string& device);

/// "cpu" stays "cpu", "cuda" becomes "cuda:0", "cuda:N" stays; throws like cuda_index_of.
std::string normalize_device(const std::string& device);

/// Whether two device names mean the same device ("cuda" and "cuda:0" do); a bad name equals
/// only itself.
bool same_device(const std::string& a, const std::string& b);

/// Where a tensor's storage lives.
enum class device_kind : uint8_t { cpu = 0, cuda = 1 };

/// "cpu" or "cuda".
const char* to_string(device_kind d);

/// Runtime entry points of one device kind. Every function pointer is set by the registering
/// library. Errors are reported as exceptions (std::runtime_error, std::bad_alloc), never aborts.
struct device_hooks {
  const char* name = nullptr;  ///< "cuda"
  /// Number of usable devices; 0 when the driver or the device is missing. Never throws.
  int (*device_count)() = nullptr;
  /// Device allocation of `bytes` (> 0) on the calling thread's current device; throws std::bad_alloc.
  void* (*alloc)(size_t bytes) = nullptr;
  /// Releases memory from alloc after all work queued so far; never throws.
  void (*free)(void* p) noexcept = nullptr;
  /// Sets `bytes` bytes to zero.
  void (*memset_zero)(void* p, size_t bytes) = nullptr;
  /// Sets n floats to v.
  void (*fill_f32)(float* p, int64_t n, float v) = nullptr;
  /// Host to device; returns when the host buffer may be reused.
  void (*copy_h2d)(void* dst, const void* src, size_t bytes) = nullptr;
  /// Device to host; returns when the data is in `dst` (synchronises with queued work).
  void (*copy_d2h)(void* dst, const void* src, size_t bytes) = nullptr;
  /// Device to device, ordered after queued work.
  void (*copy_d2d)(void* dst, const void* src, size_t bytes) = nullptr;
};

/// Installs the hooks of `kind` (the table must outlive the process; device_kind::cpu is
/// rejected with std::runtime_error). Registering the same table again is a no-op.
void register_device_hooks(device_kind kind, const device_hooks* hooks);

/// The hooks registered for `kind`, or null (always null for device_kind::cpu).
const device_hooks* find_device_hooks(device_kind kind) noexcept;

/// The hooks registered for `kind`; throws std::runtime_error explaining that the CUDA backend
/// is not compiled in or not registered (call fusion::register_cuda_backend()).
const device_hooks& device_hooks_for(device_kind kind);

/// How the GEMMs of CUDA ops compute (runtime.precision). fp32: cuBLAS SGEMM. bf16: operands
/// stay f32 in memory (f32 master weights, activations and gradients) and cuBLAS rounds them to
/// bf16 for the tensor cores, accumulating in f32 (CUBLAS_COMPUTE_32F_FAST_16BF). CPU ops always
/// compute in f32.
enum class gemm_precision : uint8_t { fp32, bf16 };

/// "fp32" or "bf16".
const char* to_string(gemm_precision p) noexcept;
/// Parses "fp32" or "bf16"; std::runtime_error naming the accepted values otherwise.
gemm_precision parse_gemm_precision(const std::string& name);

/// Execution resources of one op actor, handed to op::forward/backward (forward_args::ctx).
/// Owned by a fusion::backend (ops/backend.hpp); opaque handles keep this header CUDA-free.
struct exec_context {
  device_kind device = device_kind::cpu;
  int device_index = 0;          ///< CUDA device ordinal
  void* stream = nullptr;        ///< cudaStream_t of the actor (a blocking stream)
  void* blas = nullptr;          ///< cublasHandle_t bound to `stream`
  int* error_flag = nullptr;     ///< device int[4]: kernels record the first bad token/target id
                                 ///< (code, position, id, limit); backend::synchronize() reports it
  gemm_precision gemm = gemm_precision::fp32;  ///< how the op's GEMMs compute (CUDA only)
};

}  // namespace fusion
