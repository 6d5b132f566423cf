// Batched matrix product of two activations: CUDA kernels and op (CPU twin: ops/cpu/matmul.cpp).
//
// Shape legend: Z batch matrices (product of the leading dims), M, K, N matrix sizes.
//   a (..., M, K), b (..., K, N) [or (..., N, K) with transpose_b] -> out (..., M, N)
// One strided-batched cuBLAS GEMM per product; backward accumulates (beta = 1).
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {
constexpr const char* matmul_name = "matmul";
}  // namespace

void matmul_forward_cuda(float* out, const float* a, const float* b, int64_t Z, int64_t M, int64_t K, int64_t N,
                         bool transpose_b, const launch& l) {
  if (Z == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // an empty inner product is 0; cuBLAS rejects leading dimension 0
    fill_cuda(out, Z * M * N, 0.0f, l.stream);
    return;
  }
  const int m = cpu::blas_int(M, matmul_name), k = cpu::blas_int(K, matmul_name), n = cpu::blas_int(N, matmul_name);
  const int z = cpu::blas_int(Z, matmul_name);
  gemm_batched(l, false, transpose_b, m, n, k, 1.0f, a, k, M * K, b, transpose_b ? k : n, K * N, 0.0f, out, n,
               M * N, z);
}

void matmul_backward_cuda(float* da, float* db, const float* dout, const float* a, const float* b, int64_t Z,
                          int64_t M, int64_t K, int64_t N, bool transpose_b, const launch& l) {
  if (Z == 0 || M == 0 || N == 0 || K == 0) return;  // some gradient is empty or zero
  const int m = cpu::blas_int(M, matmul_name), k = cpu::blas_int(K, matmul_name), n = cpu::blas_int(N, matmul_name);
  const int z = cpu::blas_int(Z, matmul_name);
  // (M,N) x (K,N)^T when b is (K,N); (M,N) x (N,K) when b is (N,K).
  if (da)
    gemm_batched(l, false, !transpose_b, m, k, n, 1.0f, dout, n, M * N, b, transpose_b ? k : n, K * N, 1.0f, da,
                 k, M * K, z);
  if (db) {
    if (transpose_b)  // (N,K) += dout^T a
      gemm_batched(l, true, false, n, k, m, 1.0f, dout, n, M * N, a, k, M * K, 1.0f, db, k, K * N, z);
    else  // (K,N) += a^T dout
      gemm_batched(l, true, false, k, n, m, 1.0f, a, k, M * K, dout, n, M * N, 1.0f, db, n, K * N, z);
  }
}

namespace {

class matmul_op final : public cuda_op {
 public:
  explicit matmul_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(matmul_name, attrs)), transpose_b_(attrs.get_bool("transpose_b", false)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(matmul_name, a, 2, 0);
    check_device_f32(matmul_name, "input 0", a.inputs[0]);
    check_device_f32(matmul_name, "input 1", a.inputs[1]);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(matmul_name, a.output->type());
    check_device_f32(matmul_name, "output", a.output);
    cpu::check_tensor_shape(matmul_name, "output", a.output, out);
    const dims d = dims_of(*a.inputs[0]);
    matmul_forward_cuda(a.output->f32(), a.inputs[0]->f32(), a.inputs[1]->f32(), d.Z, d.M, d.K, out.back(),
                        transpose_b_, launch_of(a.ctx, matmul_name));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(matmul_name, a, 2, 0);
    check_device_f32(matmul_name, "input 0", a.inputs[0]);
    check_device_f32(matmul_name, "input 1", a.inputs[1]);
    const shape_t out = infer_from(a.inputs);
    check_device_f32(matmul_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(matmul_name, "output grad", a.output_grad, out);
    tensor* dx = a.input_grads[0];
    tensor* dy = a.input_grads[1];
    if (dx)
      check_device_f32_shape(matmul_name, "input 0 grad", dx, a.inputs[0]->shape());
    if (dy)
      check_device_f32_shape(matmul_name, "input 1 grad", dy, a.inputs[1]->shape());
    const dims d = dims_of(*a.inputs[0]);
    matmul_backward_cuda(dx ? dx->f32() : nullptr, dy ? dy->f32() : nullptr, a.output_grad->f32(), a.inputs[0]->f32(),
                         a.inputs[1]->f32(), d.Z, d.M, d.K, out.back(), transpose_b_, launch_of(a.ctx, matmul_name));
  }

 private:
  struct dims {
    int64_t Z, M, K;
  };
  // Sizes of input 0 (..., M, K); infer_shape has already checked it against input 1.
  static dims dims_of(const tensor& x) {
    int64_t Z = 1;
    for (size_t i = 0; i + 2 < x.rank(); ++i) Z *= x.shape()[i];
    return {Z, x.dim(-2), x.dim(-1)};
  }

  bool transpose_b_;
};

}  // namespace

std::unique_ptr<op> make_matmul_cuda(const attr_map& attrs) { return std::make_unique<matmul_op>(attrs); }

}  // namespace fusion::cuda
