// Error reporting, call contexts, row-major cuBLAS GEMMs and the shared small kernels of
// ops/cuda/ (see common.cuh).
//
// Shape legend: n elements; rows x cols for column sums; GEMM sizes as in ops/cpu/blas.hpp.
#include "ops/cuda/common.cuh"

#include <algorithm>
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
    return {static_cast<cudaStream_t>(ctx->stream), static_cast<cublasHandle_t>(ctx->blas), ctx->error_flag,
            ctx->gemm};
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
// fp32 keeps cublasSgemm (bit-for-bit the results of every earlier build); bf16 asks GemmEx for
// the tensor-core path on the same f32 arrays, so no op needs a bf16 copy of its tensors.
void gemm(const launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (l.gemm == gemm_precision::fp32) {
    CUBLAS_CHECK(cublasSgemm(l.blas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    return;
  }
  CUBLAS_CHECK(cublasGemmEx(l.blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                            CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
}

void gemm_batched(const launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b, float beta, float* c, int ldc,
                  int64_t stride_c, int batch) {
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto sa = static_cast<long long>(stride_a), sb = static_cast<long long>(stride_b),
             sc = static_cast<long long>(stride_c);
  if (l.gemm == gemm_precision::fp32) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(l.blas, op_b, op_a, n, m, k, &alpha, b, ldb, sb, a, lda, sa, &beta, c, ldc,
                                           sc, batch));
    return;
  }
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(l.blas, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, sb, a, CUDA_R_32F,
                                          lda, sa, &beta, c, CUDA_R_32F, ldc, sc, batch,
                                          CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
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

// Block (32, 8) of the grid (column tiles, chunks): threadIdx.x picks a column of the tile,
// threadIdx.y a lane of the chunk's rows {y, y + 8, ...}; lanes are summed in a fixed order.
__global__ void column_sum_parts_kernel(float* parts, const float* src, int64_t rows, int64_t cols, int64_t per) {
  __shared__ float part[column_lanes][column_tile + 1];
  const int64_t col = int64_t(blockIdx.x) * column_tile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += column_lanes) acc += src[r * cols + col];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int y = 0; y < column_lanes; ++y) s += part[y][threadIdx.x];
    parts[int64_t(blockIdx.y) * cols + col] = s;
  }
}

__global__ void column_parts_sum_kernel(float* dst, const float* parts, int64_t chunks, int64_t cols) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) s += parts[k * cols + j];
    dst[j] += s;
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

column_split column_split_for(int64_t rows, int64_t cols) {
  constexpr int64_t want_blocks = 1024;  // several per multiprocessor on an H100/H200
  constexpr int64_t min_rows = 32;       // a chunk keeps each lane busy for a few rows
  const int64_t tiles = (cols + column_tile - 1) / column_tile;
  int64_t chunks = std::min((want_blocks + tiles - 1) / tiles, (rows + min_rows - 1) / min_rows);
  chunks = std::max<int64_t>(chunks, 1);
  column_split out;
  out.rows_per_chunk = (rows + chunks - 1) / chunks;
  out.chunks = (rows + out.rows_per_chunk - 1) / out.rows_per_chunk;
  return out;
}

void column_parts_accumulate_cuda(float* dst, const float* parts, int64_t chunks, int64_t cols, cudaStream_t s) {
  column_parts_sum_kernel<<<grid_for(cols), block_threads, 0, s>>>(dst, parts, chunks, cols);
  CUDA_CHECK_LAUNCH();
}

void column_sum_accumulate_cuda(float* dst, const float* src, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const column_split z = column_split_for(rows, cols);
  // Freed stream-ordered (ops/cuda/device.cu) after the kernels below.
  tensor parts = tensor::uninitialized({z.chunks, cols}, dtype::f32, device_kind::cuda);
  const dim3 grid(static_cast<unsigned>((cols + column_tile - 1) / column_tile), static_cast<unsigned>(z.chunks));
  column_sum_parts_kernel<<<grid, dim3(column_tile, column_lanes), 0, s>>>(parts.f32(), src, rows, cols,
                                                                            z.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  column_parts_accumulate_cuda(dst, parts.f32(), z.chunks, cols, s);
}

}  // namespace fusion::cuda
