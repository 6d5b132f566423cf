// Optimizer and reduction kernels of the CUDA backend (CPU twin: core/optim.cpp): AdamW and SGD
// updates with exactly the formulas of ops/optim.hpp, and the sum of squares behind global
// gradient-norm clipping.
//
// Shape legend: n elements of one parameter tensor; p, g, m, v, buf all have n elements.
// Scalars are computed on the host in double and cast to float as the CPU code does; element
// math is float.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "ops/optim.hpp"
#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float shrink, float b1, float b2,
                             float one_minus_b1, float one_minus_b2, float step_size, float inv_bc2_sqrt, float eps,
                             float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * shrink - step_size * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, float wd, float mu, float lr,
                           float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * grad_scale + wd * p[i];
    // With a zero-initialised buffer, momentum * 0 + g equals PyTorch's first-step buf = g.
    const float bi = mu * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * bi;
  }
}

// Stage 1: each block writes the double sum of x^2 over its grid-stride share.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Stage 2: one block adds the partials. The grid depends on n only, so the result is the same
// on every run and every device.
__global__ void sum_squares_final_kernel(double* out, const double* partial, int parts) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

}  // namespace

void adamw_update_cuda(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr,
                       const optim_config& c, bool decay, float grad_scale, cudaStream_t s) {
  if (t < 1) throw std::invalid_argument("adamw_update: step t must be >= 1 (1-based), got " + std::to_string(t));
  if (n <= 0) return;
  const auto shrink = static_cast<float>(decay ? 1.0 - lr * c.weight_decay : 1.0);
  const double td = static_cast<double>(t);
  const auto step_size = static_cast<float>(lr / (1.0 - std::pow(c.beta1, td)));
  const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(c.beta2, td)));
  adamw_kernel<<<grid_for(n), block_threads, 0, s>>>(
      p, g, m, v, n, shrink, static_cast<float>(c.beta1), static_cast<float>(c.beta2), static_cast<float>(1.0 - c.beta1),
      static_cast<float>(1.0 - c.beta2), step_size, inv_bc2_sqrt, static_cast<float>(c.eps), grad_scale);
  CUDA_CHECK_LAUNCH();
}

void sgd_update_cuda(float* p, const float* g, float* buf, int64_t n, double lr, const optim_config& c, bool decay,
                     float grad_scale, cudaStream_t s) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), block_threads, 0, s>>>(p, g, buf, n, static_cast<float>(decay ? c.weight_decay : 0.0),
                                                   static_cast<float>(c.momentum), static_cast<float>(lr), grad_scale);
  CUDA_CHECK_LAUNCH();
}

void sum_of_squares_cuda(double* out, double* scratch, const float* x, int64_t n, cudaStream_t s) {
  const unsigned parts = n <= 0 ? 1 : std::min<unsigned>(grid_for(n), unsigned(sum_squares_max_parts));
  sum_squares_partial_kernel<<<parts, block_threads, 0, s>>>(scratch, x, n);
  CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, block_threads, 0, s>>>(out, scratch, static_cast<int>(parts));
  CUDA_CHECK_LAUNCH();
}

}  // namespace fusion::cuda
