// Shared pieces of the CUDA kernels: error checks that throw op_error (never abort), the
// execution context of a call (stream, cuBLAS handle), launch sizes, block reductions,
// row-major cuBLAS GEMMs and the few kernels several ops share (dst += src, column sums).
//
// Conventions of every kernel in ops/cuda/: f32 only; element indices are int64_t and loops are
// grid-stride, so any tensor size works with a bounded grid; kernels are queued on the call's
// stream and nothing here synchronises with the host.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ops/optim.hpp"
#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cuda {

/// Throws op_error "FILE:LINE: EXPR failed: cudaErrorX (message)".
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line);
/// Throws op_error "FILE:LINE: EXPR failed: CUBLAS_STATUS_X (message)".
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file, int line);

/// Checks a CUDA runtime call.
#define CUDA_CHECK(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t fusion_cuda_err_ = (expr);                                          \
    if (fusion_cuda_err_ != cudaSuccess)                                                  \
      ::fusion::cuda::throw_cuda_error(fusion_cuda_err_, #expr, __FILE__, __LINE__);      \
  } while (0)

/// Checks the launch of the kernel just queued (configuration errors; not its execution).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/// Checks a cuBLAS call.
#define CUBLAS_CHECK(expr)                                                                \
  do {                                                                                    \
    const cublasStatus_t fusion_cublas_st_ = (expr);                                      \
    if (fusion_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::fusion::cuda::throw_cublas_error(fusion_cublas_st_, #expr, __FILE__, __LINE__);   \
  } while (0)

/// Codes kernels write into exec_context::error_flag[0].
enum bad_id_code : int { bad_token_id = 1, bad_target_id = 2 };

/// The resources one op call runs with.
struct launch {
  cudaStream_t stream;
  cublasHandle_t blas;
  int* error_flag;  ///< device int[4] (code, position, id, limit), may be null
  gemm_precision gemm = gemm_precision::fp32;  ///< how gemm() and gemm_batched() compute
};

/// Resolves forward_args/backward_args::ctx. A null ctx selects the calling thread's default
/// context (legacy stream, a cuBLAS handle per thread); a non-CUDA ctx is an op_error.
launch launch_of(const exec_context* ctx, const char* who);

/// Threads per block of the elementwise and row kernels (a multiple of 32).
inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill an H100/H200 several times over,
/// never more than needed, at least 1.
inline unsigned grid_for(int64_t n, int threads = block_threads) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = 8192;
  return static_cast<unsigned>(want < 1 ? 1 : (want > cap ? cap : want));
}

/// Threads for a one-block-per-row kernel over rows of `len` elements: a multiple of 32 in
/// [32, 256], so short rows do not leave most of a block idle.
inline int row_threads(int64_t len) {
  const int64_t t = (len + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > block_threads ? block_threads : t));
}

/// Blocks for a kernel that gives one block per row (grid-stride over rows beyond the cap).
inline unsigned rows_grid(int64_t rows) {
  const int64_t cap = 65535;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > cap ? cap : rows));
}

/// An f32 tensor in device memory; op_error naming `who` and `what` otherwise.
void check_device_f32(const char* who, const char* what, const tensor* t);
/// An i32 tensor (ids, targets) in device memory.
void check_device_i32(const char* who, const char* what, const tensor* t);
/// A gradient (or other) f32 device tensor of exactly shape `want`.
inline void check_device_f32_shape(const char* who, const char* what, const tensor* t, const shape_t& want) {
  check_device_f32(who, what, t);
  cpu::check_tensor_shape(who, what, t, want);
}
/// f32 is the only precision of the CUDA ops (`t` is the dtype of the call's output).
void check_f32_call(const char* who, dtype t);

// ---- device helpers -----------------------------------------------------------------------

/// Records the first out-of-range id of a call (the first CAS winner writes the details).
__device__ inline void record_bad_id(int* flag, int code, int64_t pos, int id, int64_t limit) {
  if (flag != nullptr && atomicCAS(flag, 0, code) == 0) {
    flag[1] = static_cast<int>(pos);
    flag[2] = id;
    flag[3] = static_cast<int>(limit);
  }
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block, returned to every thread. All threads of the block must call it;
/// blockDim.x must be a multiple of 32; `shared` holds 32 T and may be reused right away.
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading shared[0]
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? shared[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

/// Max over the block, returned to every thread (same rules as block_sum).
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nwarps ? shared[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

// ---- host launchers shared by several ops ------------------------------------------------

/// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (same arguments as
/// ops/cpu/blas.hpp gemm) on the call's stream: cublasSgemm in fp32; in bf16, cublasGemmEx on
/// the same f32 arrays with CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor-core products, f32 sums).
void gemm(const launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

/// `batch` independent row-major GEMMs; matrix i of A starts at a + i * stride_a (same for B, C).
void gemm_batched(const launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float beta, float* c, int ldc,
                  int64_t stride_c, int batch);

/// dst[i] += src[i] for i in [0, n) (gradient accumulation and fan-in sums).
void add_inplace_cuda(float* dst, const float* src, int64_t n, cudaStream_t s);

/// dst[j] += sum over r of src[r * cols + j] (bias and position-table gradients), in a fixed
/// order so results do not depend on scheduling.
void column_sum_accumulate_cuda(float* dst, const float* src, int64_t rows, int64_t cols, cudaStream_t s);

/// Columns per block and row lanes of a first-stage column kernel: block (column_tile,
/// column_lanes), one warp wide so row reads are coalesced.
inline constexpr int column_tile = 32;
inline constexpr int column_lanes = 8;

/// How a two-stage column reduction over (rows, cols) cuts the rows: the first stage runs a grid
/// (column tiles, chunks) that fills the device even for a few hundred columns (one block per
/// column tile left 108 of an H200's 132 multiprocessors idle on 768 channels), each block
/// writing one partial sum per column; the second adds the chunks up in order.
struct column_split {
  int64_t chunks = 1;          ///< grid.y of the first stage
  int64_t rows_per_chunk = 0;  ///< rows [k * rows_per_chunk, (k + 1) * rows_per_chunk) go to chunk k
};
column_split column_split_for(int64_t rows, int64_t cols);

/// The second stage: dst[j] += sum over k < chunks of parts[k * cols + j], k ascending.
void column_parts_accumulate_cuda(float* dst, const float* parts, int64_t chunks, int64_t cols, cudaStream_t s);

/// p[i] = v for i in [0, n).
void fill_cuda(float* p, int64_t n, float v, cudaStream_t s);

// ---- optimizer launchers (optim.cu), used by the backend ---------------------------------

/// ops/optim.hpp adamw_update on device arrays (std::invalid_argument for t < 1).
void adamw_update_cuda(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr,
                       const optim_config& c, bool decay, float grad_scale, cudaStream_t s);
/// ops/optim.hpp sgd_update on device arrays.
void sgd_update_cuda(float* p, const float* g, float* buf, int64_t n, double lr, const optim_config& c, bool decay,
                     float grad_scale, cudaStream_t s);
/// Most blocks sum_of_squares_cuda uses: its `scratch` holds this many doubles.
inline constexpr int sum_squares_max_parts = 1024;
/// out[0] = sum of x[i]^2 in double (deterministic two-stage reduction); out is device memory.
void sum_of_squares_cuda(double* out, double* scratch, const float* x, int64_t n, cudaStream_t s);


/// Base of every CUDA op: shape inference, parameters, gradient flags and cost come from the
/// CPU op of the same kind and attributes (one source of truth); subclasses add the kernels.
class cuda_op : public op {
 public:
  explicit cuda_op(std::unique_ptr<op> cpu) : cpu_(std::move(cpu)) {}
  const char* kind() const override { return cpu_->kind(); }
  int arity() const override { return cpu_->arity(); }
  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    return cpu_->infer_shape(in, types);
  }
  std::vector<param_spec> params(std::span<const shape_t> in) const override { return cpu_->params(in); }
  std::vector<buffer_spec> buffers(std::span<const shape_t> in) const override { return cpu_->buffers(in); }
  std::vector<std::string> metric_names() const override { return cpu_->metric_names(); }
  bool input_has_grad(size_t i) const override { return cpu_->input_has_grad(i); }
  bool backward_reads_inputs() const override { return cpu_->backward_reads_inputs(); }
  op_cost cost(std::span<const shape_t> in) const override { return cpu_->cost(in); }

 protected:
  /// infer_shape on the tensors actually handed over (shape and dtype errors as at load time).
  shape_t infer_from(std::span<const tensor* const> inputs) const {
    std::vector<shape_t> shapes;
    std::vector<dtype> types;
    for (const tensor* t : inputs) shapes.push_back(t->shape()), types.push_back(t->type());
    return cpu_->infer_shape(shapes, types);
  }

  std::unique_ptr<op> cpu_;
};

}  // namespace fusion::cuda
