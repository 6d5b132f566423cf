// Batched matrix product of two activations (no parameters). The CPU kernels, defined and
// instantiated for T = float and double in ops/cpu/matmul.cpp.
//
// Shape legend: Z batch (product of the leading dims, e.g. B*NH), M rows, K inner, N columns.
//   a (..., M, K), b (..., K, N)                 -> out (..., M, N)   (transpose_b = false)
//   a (..., M, K), b (..., N, K)                 -> out (..., M, N)   (transpose_b = true)
// Both inputs carry the same leading dims. All buffers are row-major and contiguous; batch matrix
// z starts at z*M*K in a, z*K*N in b and z*M*N in out. Forward overwrites `out`; backward
// ACCUMULATES (+=) into the gradients.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out[z](M,N) = a[z](M,K) op(b[z]) for z < Z; op(b) = b (K,N) or b^T when b is (N,K).
/// K = 0 gives out = 0. Throws op_error when M, K or N exceeds the BLAS int range.
template <class T>
void matmul_forward_cpu(T* out, const T* a, const T* b, int64_t Z, int64_t M, int64_t K, int64_t N,
                        bool transpose_b);

/// da[z] += dout[z] op(b[z])^T; db[z] += a[z]^T dout[z] (or dout[z]^T a[z] when transposed).
/// `da` or `db` may be null.
template <class T>
void matmul_backward_cpu(T* da, T* db, const T* dout, const T* a, const T* b, int64_t Z, int64_t M, int64_t K,
                         int64_t N, bool transpose_b);

}  // namespace fusion::cpu
