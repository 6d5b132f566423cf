// Fully connected layer y = x W^T + b: CPU kernels (contract in ops/linear.hpp) and op.
//
// Forward is one gemm; backward is two gemms (dx += dy W, dW += dy^T x) plus a column sum for db,
// all accumulating (beta = 1) into the gradients the actor holds.
#include "ops/linear.hpp"

#include <string>

#include "ops/cpu/blas.hpp"
#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

constexpr const char* linear_name = "linear";

template <class T>
void linear_forward_cpu(T* out, const T* in, const T* weight, const T* bias, int64_t M, int64_t K, int64_t N) {
  if (M == 0) return;
  const int m = blas_int(M, linear_name), k = blas_int(K, linear_name), n = blas_int(N, linear_name);
  T beta = 0;
  if (bias) {
    // Seed every row with the bias and let gemm accumulate onto it: one pass over out, not two.
    for (int64_t r = 0; r < M; ++r) {
      T* o = out + r * N;
      for (int64_t j = 0; j < N; ++j) o[j] = bias[j];
    }
    beta = 1;
  }
  gemm(false, true, m, n, k, T(1), in, k, weight, k, beta, out, n);
}

template <class T>
void linear_backward_cpu(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t M,
                         int64_t K, int64_t N) {
  if (M == 0) return;
  const int m = blas_int(M, linear_name), k = blas_int(K, linear_name), n = blas_int(N, linear_name);
  if (din) gemm(false, false, m, k, n, T(1), dout, n, weight, k, T(1), din, k);
  if (dweight) gemm(true, false, n, k, m, T(1), dout, n, in, k, T(1), dweight, k);
  if (dbias)
    for (int64_t r = 0; r < M; ++r) {
      const T* d = dout + r * N;
      for (int64_t j = 0; j < N; ++j) dbias[j] += d[j];
    }
}

template void linear_forward_cpu<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_forward_cpu<double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                         int64_t);
template void linear_backward_cpu<float>(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                         int64_t, int64_t);
template void linear_backward_cpu<double>(double*, double*, double*, const double*, const double*, const double*,
                                          int64_t, int64_t, int64_t);

namespace {

/// attrs: out (N, required), bias (default true), in (K, optional check), init_std (default 0.02).
class linear_op final : public op {
 public:
  explicit linear_op(const attr_map& attrs)
      : out_(positive_attr(attrs, linear_name, "out")),
        in_(attrs.has("in") ? positive_attr(attrs, linear_name, "in") : -1),
        bias_(with_op_name(linear_name, [&] { return attrs.get_bool("bias", true); })),
        init_std_(with_op_name(linear_name, [&] { return attrs.get_float("init_std", 0.02); })) {
    if (!(init_std_ >= 0))
      throw op_error(std::string(linear_name) + ": attribute 'init_std' must be >= 0, got " +
                     std::to_string(init_std_));
  }

  const char* kind() const override { return linear_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(linear_name, in, types, 1);
    check_min_rank(linear_name, in[0], 0, 1, "(..., K)");
    check_float_input(linear_name, types, 0);
    const int64_t K = in[0].back();
    if (in_ >= 0 && K != in_)
      throw op_error(std::string(linear_name) + ": input last dimension " + std::to_string(K) +
                     " does not match attribute in=" + std::to_string(in_));
    if (K == 0) throw op_error(std::string(linear_name) + ": input last dimension (K) is 0");
    shape_t out = in[0];
    out.back() = out_;
    return out;
  }

  std::vector<param_spec> params(std::span<const shape_t> in) const override {
    const int64_t K = !in.empty() && !in[0].empty() ? in[0].back() : in_;
    if (K <= 0) throw op_error(std::string(linear_name) + ": cannot size weight without an input shape or 'in'");
    std::vector<param_spec> ps{{"weight", {out_, K}, param_init::normal, static_cast<float>(init_std_), true}};
    if (bias_) ps.push_back({"bias", {out_}, param_init::zeros, 0.0f, false});
    return ps;
  }

  void forward(const forward_args& a) const override {
    check_forward_call(linear_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    const mk d = rows_cols(x);
    check_params(a.params, d.K);
    check_tensor_shape(linear_name, "output", a.output, out_shape(x));
    dispatch_float(a.output->type(), linear_name, [&](auto tag) {
      using T = decltype(tag);
      linear_forward_cpu(a.output->data<T>(), x.data<T>(), a.params[0]->data<T>(),
                         bias_ ? a.params[1]->data<T>() : nullptr, d.M, d.K, out_);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(linear_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    const mk d = rows_cols(x);
    check_params(a.params, d.K);
    check_tensor_shape(linear_name, "output grad", a.output_grad, out_shape(x));
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = bias_ ? a.param_grads[1] : nullptr;
    if (dx) check_tensor_shape(linear_name, "input grad", dx, x.shape());
    if (dw) check_tensor_shape(linear_name, "weight grad", dw, {out_, d.K});
    if (db) check_tensor_shape(linear_name, "bias grad", db, {out_});
    dispatch_float(a.output_grad->type(), linear_name, [&](auto tag) {
      using T = decltype(tag);
      linear_backward_cpu(dx ? dx->data<T>() : nullptr, dw ? dw->data<T>() : nullptr,
                          db ? db->data<T>() : nullptr, a.output_grad->data<T>(), x.data<T>(),
                          a.params[0]->data<T>(), d.M, d.K, out_);
    });
  }

  /// Forward 2*M*N*K (+ M*N bias adds); backward 4*M*N*K (two gemms) (+ M*N for the bias grad).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(linear_name, in, 1);
    const double M = static_cast<double>(leading_rows(in[0]));
    const double K = in[0].empty() ? 0 : static_cast<double>(in[0].back());
    const double N = static_cast<double>(out_);
    const double nb = bias_ ? N : 0;
    op_cost c;
    c.flops_forward = 2 * M * N * K + (bias_ ? M * N : 0);
    c.flops_backward = 4 * M * N * K + (bias_ ? M * N : 0);
    c.param_bytes = (N * K + nb) * cost_elem_bytes;
    c.output_bytes = M * N * cost_elem_bytes;
    c.bytes_forward = (M * K + N * K + nb + M * N) * cost_elem_bytes;
    // Reads x, W, dy; read-modify-writes dx, dW, db.
    c.bytes_backward = (M * K + N * K + M * N + 2 * (M * K + N * K + nb)) * cost_elem_bytes;
    return c;
  }

 private:
  size_t n_params() const { return bias_ ? 2 : 1; }

  shape_t out_shape(const tensor& x) const {
    shape_t s = x.shape();
    s.back() = out_;
    return s;
  }

  struct mk {
    int64_t M, K;
  };
  mk rows_cols(const tensor& x) const {
    if (x.rank() < 1 || (in_ >= 0 && x.dim(-1) != in_))
      throw op_error(std::string(linear_name) + ": input has shape " + to_string(x.shape()) +
                     ", expected (..., K)" + (in_ >= 0 ? " with K=" + std::to_string(in_) : std::string()));
    return {leading_rows(x.shape()), x.dim(-1)};
  }

  void check_params(std::span<const tensor* const> ps, int64_t K) const {
    check_tensor_shape(linear_name, "param weight", ps[0], {out_, K});
    if (bias_) check_tensor_shape(linear_name, "param bias", ps[1], {out_});
  }

  int64_t out_;
  int64_t in_;  ///< -1 when not given
  bool bias_;
  double init_std_;
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_linear_cpu(const attr_map& attrs) { return std::make_unique<cpu::linear_op>(attrs); }

}  // namespace fusion
