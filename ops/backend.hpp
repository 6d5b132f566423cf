// The compute backend of one op actor: which device its tensors live on, how its ops are made,
// and the few non-op kernels an actor needs (gradient fan-in sum, global-norm partial sums,
// optimizer updates). CUDA-free header: the CUDA implementation lives in ops/cuda/backend.cu.
//
// An op actor holds one backend for its whole life and, with it:
//   - creates its op with make_op() and passes context() in forward_args/backward_args::ctx;
//   - allocates parameters, gradients, optimizer state and activation outputs with
//     empty()/zeros() (device memory on CUDA);
//   - moves every incoming tensor onto its device with upload() (a no-op move when it is
//     already there) and every tensor that must leave the device with download();
//   - sums fan-in gradients with add_inplace(), computes its share of the global gradient norm
//     with sum_of_squares() and applies adamw_update()/sgd_update() on step.
// On CUDA all of these are queued on the backend's stream, in call order, without host
// synchronisation, except download(), sum_of_squares() and synchronize(), which wait for the
// stream. Call synchronize() before handing a device tensor this backend produced to another
// actor (another stream): streams are not ordered with each other.
//
// The CPU backend runs exactly today's code path (make_op from ops/registry.cpp, the functions
// of ops/optim.hpp, a plain loop for add_inplace), so switching an actor to it changes no bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/device.hpp"
#include "ops/optim.hpp"
#include "tensor/tensor.hpp"
#include "ops/op.hpp"

namespace fusion {

/// One per op actor; owns a cuBLAS handle on CUDA. Not thread-safe: one actor (one thread at a
/// time) uses it. Every CUDA backend of one device in a process queues on that device's one
/// stream, so a tensor one actor produced is ready for the next actor's kernels without waiting
/// on the host; anything that reads it on the host (download, the CPU backend's upload, edge
/// senders) waits for it.
class backend {
 public:
  virtual ~backend() = default;
  /// Device kind of every tensor this backend creates.
  virtual device_kind kind() const = 0;
  /// "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;
  /// The op `kind` for this device; throws op_error like fusion::make_op.
  virtual std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) const = 0;
  /// Uninitialised tensor on this device.
  virtual tensor empty(shape_t shape, dtype t) = 0;
  /// Zero-filled tensor on this device.
  virtual tensor zeros(shape_t shape, dtype t) = 0;
  /// `t` on this device: moved when it is already there, copied otherwise.
  virtual tensor upload(tensor t) = 0;
  /// A CPU copy of `t` (waits for queued work); a plain copy for a CPU tensor.
  virtual tensor download(const tensor& t) = 0;
  /// dst += src elementwise (f32, same shape, both on this device).
  virtual void add_inplace(tensor& dst, const tensor& src) = 0;
  /// Sum of squares of an f32 tensor, accumulated in double (waits for queued work on CUDA).
  virtual double sum_of_squares(const tensor& t) = 0;
  /// ops/optim.hpp adamw_update on tensors of this device (`t` is the 1-based step).
  virtual void adamw_update(tensor& p, const tensor& g, tensor& m, tensor& v, int64_t t, double lr,
                            const optim_config& c, bool decay, float grad_scale) = 0;
  /// ops/optim.hpp sgd_update on tensors of this device.
  virtual void sgd_update(tensor& p, const tensor& g, tensor& buf, double lr, const optim_config& c, bool decay,
                          float grad_scale) = 0;
  /// Waits for all work queued by this backend; on CUDA also reports (as op_error) an
  /// out-of-range token or target id that a kernel recorded since the last check.
  virtual void synchronize() = 0;
  /// Resources to pass as forward_args::ctx / backward_args::ctx (null for the CPU).
  virtual const exec_context* context() const = 0;
  /// Timing of queued work in numbered slots: begin_timing(k) before an op's calls and
  /// end_timing(k) after them mark the work between; timed_seconds(k) waits for it and returns
  /// its duration (host clock on the CPU, or under a cgroup CPU quota below one core the thread's
  /// CPU time: ops/cpu_quota.hpp; device events on CUDA, whose calls return before their kernels
  /// run). 0 for a slot never marked.
  virtual void begin_timing(size_t slot) = 0;
  virtual void end_timing(size_t slot) = 0;
  virtual double timed_seconds(size_t slot) = 0;
};

/// "cpu", "cuda" (= "cuda:0") or "cuda:N". Throws std::runtime_error with a clear message for an
/// unknown name, when the CUDA backend is not compiled in, or when device N does not exist.
/// `gemm` sets how the GEMMs of a CUDA backend's ops compute; the CPU backend computes in f32.
std::unique_ptr<backend> make_backend(const std::string& device, gemm_precision gemm = gemm_precision::fp32);

/// Whether this build contains the CUDA backend (FUSION_HAVE_CUDA).
bool cuda_compiled() noexcept;

/// Number of usable CUDA devices: 0 without the backend, without a driver or without a GPU.
/// Never throws.
int cuda_device_count() noexcept;

/// Registers the CUDA tensor hooks (tensor/device.hpp) when the backend is compiled in; idempotent,
/// a no-op otherwise. make_backend() calls it; call it yourself before tensor::to_device(cuda)
/// in a program that never makes a backend.
void register_cuda_backend() noexcept;

}  // namespace fusion
