// Fully connected layer y = x W^T + b: CUDA kernels and op (CPU twin: ops/cpu/linear.cpp).
//
// Shape legend: M rows (all leading dims of x), K input features, N output features.
//   x (..., K), weight (N, K), bias (N) -> y (..., N)
// Forward is one cuBLAS GEMM onto rows seeded with the bias; backward is two GEMMs with beta = 1
// (dx += dy W, dW += dy^T x) and a deterministic column sum for db, all accumulating.
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* linear_name = "linear";

// out[r, j] = bias[j]: the GEMM then accumulates onto it (beta = 1), one pass over out.
__global__ void seed_rows_kernel(float* out, const float* bias, int64_t total, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % N];
}

}  // namespace

void linear_forward_cuda(float* out, const float* in, const float* weight, const float* bias, int64_t M, int64_t K,
                         int64_t N, const launch& l) {
  if (M == 0) return;
  const int m = cpu::blas_int(M, linear_name), k = cpu::blas_int(K, linear_name), n = cpu::blas_int(N, linear_name);
  float beta = 0.0f;  // with beta = 0 cuBLAS never reads out (poisoned contents do not leak)
  if (bias) {
    seed_rows_kernel<<<grid_for(M * N), block_threads, 0, l.stream>>>(out, bias, M * N, N);
    CUDA_CHECK_LAUNCH();
    beta = 1.0f;
  }
  gemm(l, false, true, m, n, k, 1.0f, in, k, weight, k, beta, out, n);
}

void linear_backward_cuda(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, int64_t M, int64_t K, int64_t N, const launch& l) {
  if (M == 0) return;
  const int m = cpu::blas_int(M, linear_name), k = cpu::blas_int(K, linear_name), n = cpu::blas_int(N, linear_name);
  if (din) gemm(l, false, false, m, k, n, 1.0f, dout, n, weight, k, 1.0f, din, k);
  if (dweight) gemm(l, true, false, n, k, m, 1.0f, dout, n, in, k, 1.0f, dweight, k);
  if (dbias) column_sum_accumulate_cuda(dbias, dout, M, N, l.stream);
}

namespace {

class linear_op final : public cuda_op {
 public:
  explicit linear_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(linear_name, attrs)),
        out_(attrs.get_int("out")),
        bias_(attrs.get_bool("bias", true)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(linear_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    check_device_f32(linear_name, "input", &x);
    const shape_t out = infer_from(a.inputs);
    const int64_t K = x.dim(-1);
    check_f32_call(linear_name, a.output->type());
    check_params(a.params, K);
    check_device_f32(linear_name, "output", a.output);
    cpu::check_tensor_shape(linear_name, "output", a.output, out);
    linear_forward_cuda(a.output->f32(), x.f32(), a.params[0]->f32(), bias_ ? a.params[1]->f32() : nullptr,
                        cpu::leading_rows(x.shape()), K, out_, launch_of(a.ctx, linear_name));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(linear_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    check_device_f32(linear_name, "input", &x);
    const shape_t out = infer_from(a.inputs);
    const int64_t K = x.dim(-1);
    check_params(a.params, K);
    check_device_f32(linear_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(linear_name, "output grad", a.output_grad, out);
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = bias_ ? a.param_grads[1] : nullptr;
    if (dx) check_device_f32_shape(linear_name, "input grad", dx, x.shape());
    if (dw) check_device_f32_shape(linear_name, "weight grad", dw, {out_, K});
    if (db) check_device_f32_shape(linear_name, "bias grad", db, {out_});
    linear_backward_cuda(dx ? dx->f32() : nullptr, dw ? dw->f32() : nullptr, db ? db->f32() : nullptr,
                         a.output_grad->f32(), x.f32(), a.params[0]->f32(), cpu::leading_rows(x.shape()), K, out_,
                         launch_of(a.ctx, linear_name));
  }

 private:
  size_t n_params() const { return bias_ ? 2 : 1; }

  void check_params(std::span<const tensor* const> ps, int64_t K) const {
    check_device_f32(linear_name, "param weight", ps[0]);
    cpu::check_tensor_shape(linear_name, "param weight", ps[0], {out_, K});
    if (bias_) {
      check_device_f32(linear_name, "param bias", ps[1]);
      cpu::check_tensor_shape(linear_name, "param bias", ps[1], {out_});
    }
  }

  int64_t out_;
  bool bias_;
};

}  // namespace

std::unique_ptr<op> make_linear_cuda(const attr_map& attrs) { return std::make_unique<linear_op>(attrs); }

}  // namespace fusion::cuda
