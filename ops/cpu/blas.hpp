// Row-major GEMM for the CPU kernels, over float (OpenBLAS sgemm) and double (dgemm).
#pragma once

namespace fusion::cpu {

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, all row-major.
/// `lda`, `ldb`, `ldc` are the row strides of A, B and C as stored (before transposition).
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc);

/// Sets OpenBLAS's process-wide thread count (1 inside pipelined actors avoids oversubscription).
void set_blas_threads(int n);
int blas_threads();

/// Measured sgemm rate in GFLOP/s on square n x n matrices, timed over at least `min_seconds`
/// (a node reports it to the coordinator as its device profile).
double measure_sgemm_gflops(int n = 512, double min_seconds = 0.2);

}  // namespace fusion::cpu
