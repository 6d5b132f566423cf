// Layer normalisation over the last dimension: CPU kernels (contract in ops/layernorm.hpp) and op.
#include "ops/layernorm.hpp"

#include <cmath>
#include <string>

#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

template <class T>
void layernorm_forward_cpu(T* out, T* mean, T* rstd, const T* in, const T* w, const T* b,
                           int64_t rows, int64_t C, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    T* y = out + r * C;
    // Two passes (mean, then centred variance) rather than E[x^2] - E[x]^2, which cancels badly.
    const T m = lane_sum<T>(C, [&](int64_t i) { return x[i]; }) / static_cast<T>(C);
    const T v = lane_sum<T>(C, [&](int64_t i) { return (x[i] - m) * (x[i] - m); }) / static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + eps);
    for (int64_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <class T>
void layernorm_backward_cpu(T* din, T* dw, T* db, const T* dout, const T* in, const T* w,
                            const T* mean, const T* rstd, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    const T* dy = dout + r * C;
    const T m = mean[r], s = rstd[r];
    // Two row reductions give the projection terms of d(norm)/d(in).
    const T g_mean = lane_sum<T>(C, [&](int64_t i) { return w[i] * dy[i]; }) / static_cast<T>(C);
    const T g_norm_mean =
        lane_sum<T>(C, [&](int64_t i) { return w[i] * dy[i] * (x[i] - m); }) * s / static_cast<T>(C);
    // Separate loops per gradient so each one vectorises without a branch inside.
    if (db)
      for (int64_t i = 0; i < C; ++i) db[i] += dy[i];
    if (dw)
      for (int64_t i = 0; i < C; ++i) dw[i] += (x[i] - m) * s * dy[i];
    if (din) {
      T* dx = din + r * C;
      for (int64_t i = 0; i < C; ++i) dx[i] += (w[i] * dy[i] - g_mean - (x[i] - m) * s * g_norm_mean) * s;
    }
  }
}

template void layernorm_forward_cpu<float>(float*, float*, float*, const float*, const float*,
                                           const float*, int64_t, int64_t, float);
template void layernorm_forward_cpu<double>(double*, double*, double*, const double*, const double*,
                                            const double*, int64_t, int64_t, double);
template void layernorm_backward_cpu<float>(float*, float*, float*, const float*, const float*,
                                            const float*, const float*, const float*, int64_t, int64_t);
template void layernorm_backward_cpu<double>(double*, double*, double*, const double*, const double*,
                                             const double*, const double*, const double*, int64_t,
                                             int64_t);

}  // namespace fusion::cpu

namespace fusion {

namespace {

using namespace fusion::cpu;

constexpr const char* layernorm_name = "layernorm";

// Analytic per-element work (per-row scalars are negligible): forward = mean 1 + variance 3 +
// normalise 2 + affine 2; backward = two reductions 6 + dbias 1 + dweight 4 + dinput 6.
constexpr double layernorm_forward_flops_per_elem = 8;
constexpr double layernorm_backward_flops_per_elem = 17;

void check_type(const tensor* t, dtype want, const char* what) { check_tensor_dtype(layernorm_name, what, t, want); }

class layernorm_op final : public op {
 public:
  explicit layernorm_op(double eps) : eps_(eps) {}

  const char* kind() const override { return layernorm_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> inputs, std::span<const dtype> types) const override {
    check_arity(layernorm_name, inputs, types, 1);
    check_float_input(layernorm_name, types, 0);
    const shape_t& s = inputs[0];
    if (s.empty()) throw op_error("layernorm: input must have at least 1 dimension (..., C), got a scalar");
    for (int64_t d : s)
      if (d <= 0) throw op_error("layernorm: input shape " + to_string(s) + " has a non-positive dimension");
    return s;
  }

  std::vector<param_spec> params(std::span<const shape_t> inputs) const override {
    if (inputs.size() != 1 || inputs[0].empty()) throw op_error("layernorm: params need one input shape (..., C)");
    const int64_t C = inputs[0].back();
    return {{"weight", {C}, param_init::ones, 0.02f, false}, {"bias", {C}, param_init::zeros, 0.02f, false}};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(layernorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    const shape_t c_shape{in.rank() ? in.dim(-1) : 0};
    check_tensor_shape(layernorm_name, "param weight", a.params[0], c_shape);
    check_tensor_shape(layernorm_name, "param bias", a.params[1], c_shape);
    check_tensor_shape(layernorm_name, "output", a.output, in.shape());
    dispatch_float(a.output->type(), layernorm_name, [&](auto tag) {
      using T = decltype(tag);
      const dtype t = dtype_of<T>();
      check_type(&in, t, "input");
      check_type(a.params[0], t, "weight");
      check_type(a.params[1], t, "bias");
      const int64_t C = in.dim(-1), rows = leading_rows(in.shape());
      const shape_t stat_shape(in.shape().begin(), in.shape().end() - 1);
      a.saved->clear();
      a.saved->emplace_back(stat_shape, t);  // mean
      a.saved->emplace_back(stat_shape, t);  // rstd
      layernorm_forward_cpu<T>(a.output->data<T>(), (*a.saved)[0].data<T>(), (*a.saved)[1].data<T>(),
                               in.data<T>(), a.params[0]->data<T>(), a.params[1]->data<T>(), rows, C,
                               static_cast<T>(eps_));
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(layernorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    const shape_t c_shape{in.rank() ? in.dim(-1) : 0};
    check_tensor_shape(layernorm_name, "param weight", a.params[0], c_shape);
    check_tensor_shape(layernorm_name, "output grad", a.output_grad, in.shape());
    tensor* din = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = a.param_grads[1];
    if (din) check_tensor_shape(layernorm_name, "input grad", din, in.shape());
    if (dw) check_tensor_shape(layernorm_name, "weight grad", dw, c_shape);
    if (db) check_tensor_shape(layernorm_name, "bias grad", db, c_shape);
    const int64_t C = in.dim(-1), rows = leading_rows(in.shape());
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != rows || (*a.saved)[1].numel() != rows)
      throw op_error("layernorm: backward without the mean/rstd saved by forward");
    dispatch_float(a.output_grad->type(), layernorm_name, [&](auto tag) {
      using T = decltype(tag);
      const dtype t = dtype_of<T>();
      check_type(&in, t, "input");
      check_type(a.params[0], t, "weight");
      check_type(&(*a.saved)[0], t, "saved mean");
      check_type(&(*a.saved)[1], t, "saved rstd");
      if (din) check_type(din, t, "input grad");
      if (dw) check_type(dw, t, "weight grad");
      if (db) check_type(db, t, "bias grad");
      layernorm_backward_cpu<T>(din ? din->data<T>() : nullptr, dw ? dw->data<T>() : nullptr,
                                db ? db->data<T>() : nullptr, a.output_grad->data<T>(), in.data<T>(),
                                a.params[0]->data<T>(), (*a.saved)[0].data<T>(), (*a.saved)[1].data<T>(), rows, C);
    });
  }

  /// Forward 8 flops per element, backward 17 (see the constants above).
  op_cost cost(std::span<const shape_t> inputs) const override {
    const double n = static_cast<double>(numel_of(inputs[0]));
    const double C = inputs[0].empty() ? 1 : static_cast<double>(inputs[0].back());
    const double rows = static_cast<double>(leading_rows(inputs[0])), f = cost_elem_bytes;
    op_cost c;
    c.flops_forward = layernorm_forward_flops_per_elem * n;
    c.flops_backward = layernorm_backward_flops_per_elem * n;
    c.param_bytes = 2 * C * f;
    c.output_bytes = n * f;
    // forward: read in + params, write out + stats; backward: read dout, in, weight, stats,
    // read-modify-write din, dweight, dbias.
    c.bytes_forward = (2 * n + 2 * C + 2 * rows) * f;
    c.bytes_backward = (4 * n + 5 * C + 2 * rows) * f;
    return c;
  }

 private:
  double eps_;
};

}  // namespace

std::unique_ptr<op> make_layernorm_cpu(const attr_map& attrs) {
  const double eps = with_op_name(layernorm_name, [&] { return attrs.get_float("eps", 1e-5); });
  if (!(eps > 0)) throw op_error("layernorm: attribute 'eps' must be > 0, got " + attrs.get_string("eps", ""));
  return std::make_unique<layernorm_op>(eps);
}

}  // namespace fusion
