// Fully connected layer, PyTorch layout: y = x W^T + b. The CPU kernels, defined and instantiated
// for T = float and double in ops/cpu/linear.cpp.
//
// Shape legend: M rows (product of all leading dims, e.g. B*T), K input features, N output features.
//   in (..., K), weight (N,K), bias (N) -> out (..., N)
// All buffers are row-major. Forward overwrites `out`; backward ACCUMULATES (+=) into every
// gradient it is given.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out(M,N) = in(M,K) weight(N,K)^T + bias(N); `bias` may be null.
/// Throws op_error when M, K or N exceeds the BLAS int range.
template <class T>
void linear_forward_cpu(T* out, const T* in, const T* weight, const T* bias, int64_t M, int64_t K, int64_t N);

/// din(M,K) += dout(M,N) weight(N,K); dweight(N,K) += dout^T in; dbias(N) += column sums of dout.
/// Any of din, dweight, dbias may be null (no gradient wanted).
template <class T>
void linear_backward_cpu(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t M,
                         int64_t K, int64_t N);

}  // namespace fusion::cpu
