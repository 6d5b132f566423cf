// Error reporting, call contexts, row-major cuBLAS GEMMs and the shared small kernels of
// ops/cuda/ (see common.cuh).
//
// Shape legend: n elements; rows x cols for column sums; GEMM sizes as in ops/cpu/blas.hpp.
#include "ops/cuda/common.cuh"

#include <string>

namespace fusion::cuda {

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw op_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " + cudaGetErrorName(e) +
                 " (" + cudaGetErrorString(e) + ")");
}

void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw op_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                 cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

namespace {

// The context of op calls made without an exec_context: the legacy default stream and one
// cuBLAS handle per thread (a handle must not be shared by threads). Deliberately never
// destroyed: tearing cuBLAS down from a thread_local destructor can run after the CUDA runtime
// has shut down at process exit.
struct thread_default_context {
  cublasHandle_t blas = nullptr;
};

thread_local thread_default_context thread_default;

}  // namespace

launch launch_of(const exec_context* ctx, const char* who) {
  if (ctx != nullptr) {
    if (ctx->device != device_kind::cuda || ctx->blas == nullptr)
      throw op_error(std::string(who) + ": CUDA op called with a non-CUDA execution context");
    // Actor threads come from a pool: make the context's device current (cheap when it is).
    CUDA_CHECK(cudaSetDevice(ctx->device_index));
    return {static_cast<cudaStream_t>(ctx->stream), static_cast<cublasHandle_t>(ctx->blas), ctx->error_flag};
  }
  if (thread_default.blas == nullptr) {
    cublasHandle_t h = nullptr;
    CUBLAS_CHECK(cublasCreate(&h));
    thread_default.blas = h;
  }
  CUBLAS_CHECK(cublasSetStream(thread_default.blas, cudaStreamLegacy));
  return {cudaStreamLegacy, thread_default.blas, nullptr};
}

void check_device_f32(const char* who, const char* what, const tensor* t) {
  if (t == nullptr) throw op_error(std::string(who) + ": " + what + " is missing");
  if (!t->is_cuda() || t->type() != dtype::f32)
    throw op_error(std::string(who) + ": " + what + " must be an f32 tensor in CUDA memory, got " +
                   to_string(t->type()) + " on " + to_string(t->device()));
}

void check_device_i32(const char* who, const char* what, const tensor* t) {
  if (t == nullptr) throw op_error(std::string(who) + ": " + what + " is missing");
  if (!t->is_cuda() || t->type() != dtype::i32)
    throw op_error(std::string(who) + ": " + what + " must be an i32 tensor in CUDA memory, got " +
                   to_string(t->type()) + " on " + to_string(t->device()));
}

void check_f32_call(const char* who, dtype t) {
  if (t != dtype::f32)
    throw op_error(std::string(who) + ": the CUDA kernels support f32 only, got " + to_string(t));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets the operands
// swapped, n and m swapped, and each stored matrix with its own row stride as leading dimension.
void gemm(cublasHandle_t h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  CUBLAS_CHECK(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                           &alpha, b, ldb, a, lda, &beta, c, ldc));
}

void gemm_batched(cublasHandle_t h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float beta, float* c, int ldc,
                  int64_t stride_c, int batch) {
  CUBLAS_CHECK(cublasSgemmStridedBatched(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         n, m, k, &alpha, b, ldb, static_cast<long long>(stride_b), a, lda,
                                         static_cast<long long>(stride_a), &beta, c, ldc,
                                         static_cast<long long>(stride_c), batch));
}

namespace {

__global__ void add_inplace_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

constexpr int column_tile = 32;  // columns per block (one warp wide, coalesced row reads)
constexpr int column_lanes = 8;  // row lanes per block

// Block (32, 8): threadIdx.x picks a column of the tile, threadIdx.y a lane of rows
// {y, y + 8, ...}; lanes are then summed in a fixed order, so the result is deterministic.
__global__ void column_sum_kernel(float* dst, const float* src, int64_t rows, int64_t cols) {
  __shared__ float part[column_lanes][column_tile + 1];
  for (int64_t c0 = int64_t(blockIdx.x) * column_tile; c0 < cols; c0 += int64_t(gridDim.x) * column_tile) {
    const int64_t col = c0 + threadIdx.x;
    float acc = 0.0f;
    if (col < cols)
      for (int64_t r = threadIdx.y; r < rows; r += column_lanes) acc += src[r * cols + col];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      float s = 0.0f;
      for (int y = 0; y < column_lanes; ++y) s += part[y][threadIdx.x];
      dst[col] += s;
    }
    __syncthreads();  // part is rewritten by the next tile
  }
}

}  // namespace

void add_inplace_cuda(float* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_inplace_kernel<<<grid_for(n), block_threads, 0, s>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

void fill_cuda(float* p, int64_t n, float v, cudaStream_t s) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), block_threads, 0, s>>>(p, n, v);
  CUDA_CHECK_LAUNCH();
}

void column_sum_accumulate_cuda(float* dst, const float* src, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  column_sum_kernel<<<grid_for(cols, column_tile), dim3(column_tile, column_lanes), 0, s>>>(dst, src, rows, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fusion::cuda
