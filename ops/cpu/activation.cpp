// Elementwise activations (GELU, ReLU): CPU kernels (contract in ops/activation.hpp) and op.
//
// The loops are plain passes over contiguous memory so the compiler vectorises them; for float,
// tanh is a rational approximation (libm's tanhf does not vectorise without -ffast-math).
#include "ops/activation.hpp"

#include <cmath>
#include <string>

#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

/// tanh for the float path: Eigen's [13/6] rational approximation below |x| = 7.905, absolute
/// error ~2e-7 (below float resolution near +-1), and +-1 beyond; branch-free so loops vectorise.
inline float tanh_approx(float x) {
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  // Past 7.905 tanh is within 3e-7 of +-1 (and exactly +-1 in float beyond 9): saturate there,
  // which makes gelu's far tail exactly 0 however the compiler rounds (Eigen clamps x instead,
  // which relies on the ratio rounding to 1 at the clamp: with clang's fused multiply-adds it
  // gave 1 - 2.4e-7, gelu(-20) = -2.4e-6). Selects, so the loop still vectorises; the ratio's
  // value beyond (inf / inf for huge x) is never used.
  const float r = x * p / q;
  return x <= -7.90531110763549805f ? -1.0f : (x >= 7.90531110763549805f ? 1.0f : r);
}

/// The double path (gradient checks) uses libm: exactness beats speed there.
inline double tanh_approx(double x) { return std::tanh(x); }

constexpr double gelu_k0 = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double gelu_k1 = 0.044715;
}  // namespace

template <class T>
void gelu_forward_cpu(T* out, const T* in, int64_t n) {
  const T k0 = T(gelu_k0), k1 = T(gelu_k1);
  for (int64_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T t = tanh_approx(k0 * x * (T(1) + k1 * x * x));
    out[i] = T(0.5) * x * (T(1) + t);
  }
}

template <class T>
void gelu_backward_cpu(T* din, const T* in, const T* dout, int64_t n) {
  const T k0 = T(gelu_k0), k1 = T(gelu_k1);
  for (int64_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T x2 = x * x;
    const T t = tanh_approx(k0 * x * (T(1) + k1 * x2));
    // d tanh(u)/du = 1 - tanh^2: no cosh, so no overflow for large |u|.
    const T sech2 = T(1) - t * t;
    const T grad = T(0.5) * (T(1) + t) + T(0.5) * k0 * x * sech2 * (T(1) + T(3) * k1 * x2);
    din[i] += grad * dout[i];
  }
}

template <class T>
void relu_forward_cpu(T* out, const T* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] > T(0) ? in[i] : T(0);
}

template <class T>
void relu_backward_cpu(T* din, const T* in, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) din[i] += in[i] > T(0) ? dout[i] : T(0);
}

template void gelu_forward_cpu<float>(float*, const float*, int64_t);
template void gelu_forward_cpu<double>(double*, const double*, int64_t);
template void gelu_backward_cpu<float>(float*, const float*, const float*, int64_t);
template void gelu_backward_cpu<double>(double*, const double*, const double*, int64_t);
template void relu_forward_cpu<float>(float*, const float*, int64_t);
template void relu_forward_cpu<double>(double*, const double*, int64_t);
template void relu_backward_cpu<float>(float*, const float*, const float*, int64_t);
template void relu_backward_cpu<double>(double*, const double*, const double*, int64_t);

namespace {

// Per-element FLOP counts of the kernels above, with tanh counted as one operation.
//   gelu forward:  u (5), tanh (1), 0.5 x (1 + t) (3)                                  = 9
//   gelu backward: x^2 (1), u (4), tanh (1), sech^2 (2), local grad (8), din += (2)    = 18
//   relu forward:  max (1); backward: select (1), din += (1)                            = 2
struct gelu_kernels {
  static constexpr const char* name = "gelu";
  static constexpr double flops_forward = 9, flops_backward = 18;
  template <class T> static void forward(T* out, const T* in, int64_t n) { gelu_forward_cpu(out, in, n); }
  template <class T> static void backward(T* din, const T* in, const T* dout, int64_t n) {
    gelu_backward_cpu(din, in, dout, n);
  }
};

struct relu_kernels {
  static constexpr const char* name = "relu";
  static constexpr double flops_forward = 1, flops_backward = 2;
  template <class T> static void forward(T* out, const T* in, int64_t n) { relu_forward_cpu(out, in, n); }
  template <class T> static void backward(T* din, const T* in, const T* dout, int64_t n) {
    relu_backward_cpu(din, in, dout, n);
  }
};

/// One-input, parameter-free elementwise op; `K` supplies the kernels and counts.
template <class K>
class unary_op final : public op {
 public:
  explicit unary_op(const attr_map&) {}

  const char* kind() const override { return K::name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(K::name, in, types, 1);
    check_dims(K::name, in[0], 0);
    check_float_input(K::name, types, 0);
    return in[0];
  }

  void forward(const forward_args& a) const override {
    check_forward_call(K::name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_tensor_shape(K::name, "output", a.output, x.shape());
    dispatch_float(a.output->type(), K::name, [&](auto tag) {
      using T = decltype(tag);
      K::forward(a.output->data<T>(), x.data<T>(), x.numel());
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(K::name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    check_tensor_shape(K::name, "output grad", a.output_grad, x.shape());
    check_tensor_shape(K::name, "input grad", dx, x.shape());
    dispatch_float(a.output_grad->type(), K::name, [&](auto tag) {
      using T = decltype(tag);
      K::backward(dx->data<T>(), x.data<T>(), a.output_grad->data<T>(), x.numel());
    });
  }

  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(K::name, in, 1);
    const double n = static_cast<double>(numel_of(in[0]));
    op_cost c;
    c.flops_forward = K::flops_forward * n;
    c.flops_backward = K::flops_backward * n;
    c.output_bytes = n * cost_elem_bytes;
    c.bytes_forward = 2 * n * cost_elem_bytes;   // read x, write y
    c.bytes_backward = 4 * n * cost_elem_bytes;  // read x and dy, read-modify-write dx
    return c;
  }
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_gelu_cpu(const attr_map& attrs) {
  return std::make_unique<cpu::unary_op<cpu::gelu_kernels>>(attrs);
}

std::unique_ptr<op> make_relu_cpu(const attr_map& attrs) {
  return std::make_unique<cpu::unary_op<cpu::relu_kernels>>(attrs);
}

}  // namespace fusion
