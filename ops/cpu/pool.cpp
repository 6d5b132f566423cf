// Pooling (max, average, global average) and flatten: CPU kernels (contract in ops/pool.hpp) and
// the four ops.
#include "ops/pool.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

/// The real pixels [begin, end) of the window that starts at `start` (may be negative: padding).
struct window { int64_t begin, end; };
inline window clip(int64_t start, int64_t k, int64_t size) {
  return {std::max<int64_t>(start, 0), std::min(start + k, size)};
}

}  // namespace

template <class T>
void max_pool2d_forward_cpu(T* out, int32_t* argmax, const T* in, const pool2d_geometry& g) {
  const int64_t plane_in = g.H * g.W, plane_out = g.Ho * g.Wo;
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const T* x = in + pl * plane_in;
    T* y = out + pl * plane_out;
    int32_t* am = argmax + pl * plane_out;
    for (int64_t ho = 0; ho < g.Ho; ++ho) {
      const window wh = clip(ho * g.s - g.p, g.k, g.H);
      for (int64_t wo = 0; wo < g.Wo; ++wo) {
        const window ww = clip(wo * g.s - g.p, g.k, g.W);
        // Padding is -infinity, so it never beats the first real pixel, which starts the scan
        // (p <= k / 2 guarantees one). Strict > keeps the first of equal maxima; a NaN replaces
        // any number but not an earlier NaN.
        int64_t best_i = wh.begin * g.W + ww.begin;
        T best = x[best_i];
        for (int64_t h = wh.begin; h < wh.end; ++h)
          for (int64_t w = ww.begin; w < ww.end; ++w) {
            const T v = x[h * g.W + w];
            if (v > best || (v != v && best == best)) best = v, best_i = h * g.W + w;
          }
        y[ho * g.Wo + wo] = best;
        am[ho * g.Wo + wo] = static_cast<int32_t>(best_i);
      }
    }
  }
}

template <class T>
void max_pool2d_backward_cpu(T* din, const T* dout, const int32_t* argmax, const pool2d_geometry& g) {
  const int64_t plane_in = g.H * g.W, plane_out = g.Ho * g.Wo;
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    T* dx = din + pl * plane_in;
    const T* dy = dout + pl * plane_out;
    const int32_t* am = argmax + pl * plane_out;
    for (int64_t i = 0; i < plane_out; ++i) dx[am[i]] += dy[i];
  }
}

template <class T>
void avg_pool2d_forward_cpu(T* out, const T* in, const pool2d_geometry& g) {
  const int64_t plane_in = g.H * g.W, plane_out = g.Ho * g.Wo;
  const T inv = T(1) / static_cast<T>(g.k * g.k);
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const T* x = in + pl * plane_in;
    T* y = out + pl * plane_out;
    for (int64_t ho = 0; ho < g.Ho; ++ho) {
      const window wh = clip(ho * g.s - g.p, g.k, g.H);
      for (int64_t wo = 0; wo < g.Wo; ++wo) {
        const window ww = clip(wo * g.s - g.p, g.k, g.W);
        T sum = 0;
        for (int64_t h = wh.begin; h < wh.end; ++h)
          for (int64_t w = ww.begin; w < ww.end; ++w) sum += x[h * g.W + w];
        y[ho * g.Wo + wo] = sum * inv;
      }
    }
  }
}

template <class T>
void avg_pool2d_backward_cpu(T* din, const T* dout, const pool2d_geometry& g) {
  const int64_t plane_in = g.H * g.W, plane_out = g.Ho * g.Wo;
  const T inv = T(1) / static_cast<T>(g.k * g.k);
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    T* dx = din + pl * plane_in;
    const T* dy = dout + pl * plane_out;
    for (int64_t ho = 0; ho < g.Ho; ++ho) {
      const window wh = clip(ho * g.s - g.p, g.k, g.H);
      for (int64_t wo = 0; wo < g.Wo; ++wo) {
        const window ww = clip(wo * g.s - g.p, g.k, g.W);
        const T d = dy[ho * g.Wo + wo] * inv;
        for (int64_t h = wh.begin; h < wh.end; ++h)
          for (int64_t w = ww.begin; w < ww.end; ++w) dx[h * g.W + w] += d;
      }
    }
  }
}

template <class T>
void global_avg_pool_forward_cpu(T* out, const T* in, int64_t planes, int64_t HW) {
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* x = in + pl * HW;
    out[pl] = lane_sum<T>(HW, [&](int64_t i) { return x[i]; }) / static_cast<T>(HW);
  }
}

template <class T>
void global_avg_pool_backward_cpu(T* din, const T* dout, int64_t planes, int64_t HW) {
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T d = dout[pl] / static_cast<T>(HW);
    T* dx = din + pl * HW;
    for (int64_t i = 0; i < HW; ++i) dx[i] += d;
  }
}

#define FUSION_POOL_INSTANTIATE(T)                                                                  \
  template void max_pool2d_forward_cpu<T>(T*, int32_t*, const T*, const pool2d_geometry&);          \
  template void max_pool2d_backward_cpu<T>(T*, const T*, const int32_t*, const pool2d_geometry&);   \
  template void avg_pool2d_forward_cpu<T>(T*, const T*, const pool2d_geometry&);                    \
  template void avg_pool2d_backward_cpu<T>(T*, const T*, const pool2d_geometry&);                   \
  template void global_avg_pool_forward_cpu<T>(T*, const T*, int64_t, int64_t);                     \
  template void global_avg_pool_backward_cpu<T>(T*, const T*, int64_t, int64_t);
FUSION_POOL_INSTANTIATE(float)
FUSION_POOL_INSTANTIATE(double)
#undef FUSION_POOL_INSTANTIATE

}  // namespace fusion::cpu

namespace fusion {

namespace {

using namespace fusion::cpu;

// A mis-typed tensor would otherwise surface as tensor's std::logic_error.
void check_type(const char* who, const tensor* t, dtype want, const char* what) {
  if (t->type() != want)
    throw op_error(std::string(who) + ": " + what + " has dtype " + to_string(t->type()) + ", expected " +
                   to_string(want));
}

/// infer_shape of these one-input ops: one float input of rank `rank` (at least `rank` when
/// `at_least`), every dimension positive.
void check_image_input(const char* who, std::span<const shape_t> in, std::span<const dtype> types, size_t rank,
                       bool at_least, const char* legend) {
  check_arity(who, in, types, 1);
  check_float_input(who, types, 0);
  if (at_least) check_min_rank(who, in[0], 0, rank, legend);
  else check_rank(who, in[0], 0, rank, legend);
  for (int64_t d : in[0])
    if (d <= 0)
      throw op_error(std::string(who) + ": input shape " + to_string(in[0]) + " has a non-positive dimension");
}

/// Forward/backward index dimensions, so a tensor that bypassed infer_shape is caught here too.
void check_tensor_rank(const char* who, const tensor& x, size_t rank, bool at_least, const char* legend) {
  if (at_least ? x.rank() < rank : x.rank() != rank)
    throw op_error(std::string(who) + ": input must have rank " + (at_least ? ">= " : "") + std::to_string(rank) +
                   " " + legend + ", got " + to_string(x.shape()));
}

enum class pool_mode : uint8_t { max, avg };

/// max_pool2d and avg_pool2d: same attributes, shapes and window walk; max saves its argmax.
class pool2d_op final : public op {
 public:
  pool2d_op(pool_mode mode, int64_t k, int64_t s, int64_t p) : mode_(mode), k_(k), s_(s), p_(p) {}

  const char* kind() const override { return name(mode_); }
  int arity() const override { return 1; }

  static const char* name(pool_mode m) { return m == pool_mode::max ? "max_pool2d" : "avg_pool2d"; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_image_input(kind(), in, types, 4, false, "(B, C, H, W)");
    const pool2d_geometry g = geometry(in[0]);
    return {in[0][0], in[0][1], g.Ho, g.Wo};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(kind(), a, 1, 0);
    const tensor& x = *a.inputs[0];
    const pool2d_geometry g = geometry(x.shape());
    const shape_t out_shape{x.dim(0), x.dim(1), g.Ho, g.Wo};
    check_tensor_shape(kind(), "output", a.output, out_shape);
    if (mode_ == pool_mode::max && a.saved == nullptr) throw op_error("max_pool2d: forward needs a saved list");
    dispatch_float(a.output->type(), kind(), [&](auto tag) {
      using T = decltype(tag);
      check_type(kind(), &x, dtype_of<T>(), "input");
      if (mode_ == pool_mode::avg) return avg_pool2d_forward_cpu<T>(a.output->data<T>(), x.data<T>(), g);
      a.saved->clear();
      a.saved->emplace_back(tensor::uninitialized(out_shape, dtype::i32));  // argmax
      max_pool2d_forward_cpu<T>(a.output->data<T>(), (*a.saved)[0].i32(), x.data<T>(), g);
    });
  }

  bool backward_reads_inputs() const override { return false; }

  void backward(const backward_args& a) const override {
    check_backward_call(kind(), a, 1, 0);
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    const tensor& x = *dx;  // the input's shape (its values are freed after forward)
    const pool2d_geometry g = geometry(x.shape());
    const shape_t out_shape{x.dim(0), x.dim(1), g.Ho, g.Wo};
    check_tensor_shape(kind(), "output grad", a.output_grad, out_shape);
    if (mode_ == pool_mode::max &&
        (a.saved == nullptr || a.saved->size() != 1 || (*a.saved)[0].shape() != out_shape ||
         (*a.saved)[0].type() != dtype::i32))
      throw op_error("max_pool2d: backward without the argmax indices saved by forward");
    dispatch_float(a.output_grad->type(), kind(), [&](auto tag) {
      using T = decltype(tag);
      check_type(kind(), dx, dtype_of<T>(), "input grad");
      if (mode_ == pool_mode::avg) return avg_pool2d_backward_cpu<T>(dx->data<T>(), a.output_grad->data<T>(), g);
      max_pool2d_backward_cpu<T>(dx->data<T>(), a.output_grad->data<T>(), (*a.saved)[0].i32(), g);
    });
  }

  /// max: k*k comparisons per output forward, one add backward; avg: k*k adds and a multiply
  /// per output forward, a multiply and k*k adds backward. The argmax is i32 (4 bytes).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(kind(), in, 1);
    const pool2d_geometry g = geometry(in[0]);
    const double n_in = static_cast<double>(numel_of(in[0]));
    const double n_out = static_cast<double>(g.planes * g.Ho * g.Wo), kk = static_cast<double>(k_ * k_);
    const double f = cost_elem_bytes;
    op_cost c;
    c.output_bytes = n_out * f;
    if (mode_ == pool_mode::max) {
      c.flops_forward = kk * n_out;
      c.flops_backward = n_out;
      c.bytes_forward = (n_in + 2 * n_out) * f;   // read x, write y and argmax
      c.bytes_backward = (2 * n_in + 2 * n_out) * f;  // read dy and argmax, read-modify-write dx
    } else {
      c.flops_forward = (kk + 1) * n_out;
      c.flops_backward = (kk + 1) * n_out;
      c.bytes_forward = (n_in + n_out) * f;
      c.bytes_backward = (2 * n_in + n_out) * f;
    }
    return c;
  }

 private:
  pool2d_geometry geometry(const shape_t& s) const {
    if (s.size() != 4)
      throw op_error(std::string(kind()) + ": input must have rank 4 (B, C, H, W), got " + to_string(s));
    const int64_t H = s[2], W = s[3];
    if (H + 2 * p_ < k_ || W + 2 * p_ < k_)
      throw op_error(std::string(kind()) + ": input plane " + std::to_string(H) + " x " + std::to_string(W) +
                     " with padding " + std::to_string(p_) + " is smaller than the kernel " + std::to_string(k_) +
                     ", got shape " + to_string(s));
    // The argmax is an i32 index within one plane.
    if (H * W > INT32_MAX)
      throw op_error(std::string(kind()) + ": input plane " + to_string(s) + " has more than 2^31 pixels");
    return {s[0] * s[1], H, W, k_, s_, p_, (H + 2 * p_ - k_) / s_ + 1, (W + 2 * p_ - k_) / s_ + 1};
  }

  pool_mode mode_;
  int64_t k_, s_, p_;
};

constexpr const char* global_avg_pool_name = "global_avg_pool";

/// (B, C, H, W) -> (B, C): the mean of each plane (the head of a ResNet-style network).
class global_avg_pool_op final : public op {
 public:
  const char* kind() const override { return global_avg_pool_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_image_input(global_avg_pool_name, in, types, 4, false, "(B, C, H, W)");
    return {in[0][0], in[0][1]};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(global_avg_pool_name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_tensor_rank(global_avg_pool_name, x, 4, false, "(B, C, H, W)");
    check_tensor_shape(global_avg_pool_name, "output", a.output, {x.dim(0), x.dim(1)});
    dispatch_float(a.output->type(), global_avg_pool_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(global_avg_pool_name, &x, dtype_of<T>(), "input");
      global_avg_pool_forward_cpu<T>(a.output->data<T>(), x.data<T>(), x.dim(0) * x.dim(1), x.dim(2) * x.dim(3));
    });
  }

  bool backward_reads_inputs() const override { return false; }

  void backward(const backward_args& a) const override {
    check_backward_call(global_avg_pool_name, a, 1, 0);
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    const tensor& x = *dx;  // the input's shape (its values are freed after forward)
    check_tensor_rank(global_avg_pool_name, x, 4, false, "(B, C, H, W)");
    check_tensor_shape(global_avg_pool_name, "output grad", a.output_grad, {x.dim(0), x.dim(1)});
    dispatch_float(a.output_grad->type(), global_avg_pool_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(global_avg_pool_name, dx, dtype_of<T>(), "input grad");
      global_avg_pool_backward_cpu<T>(dx->data<T>(), a.output_grad->data<T>(), x.dim(0) * x.dim(1),
                                      x.dim(2) * x.dim(3));
    });
  }

  /// One add per input and one divide per output, forward and backward alike.
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(global_avg_pool_name, in, 1);
    const double n = static_cast<double>(numel_of(in[0]));
    const double n_out = in[0].size() >= 2 ? static_cast<double>(in[0][0] * in[0][1]) : 1, f = cost_elem_bytes;
    op_cost c;
    c.flops_forward = n + n_out;
    c.flops_backward = n + n_out;
    c.output_bytes = n_out * f;
    c.bytes_forward = (n + n_out) * f;
    c.bytes_backward = (2 * n + n_out) * f;  // read dy, read-modify-write dx
    return c;
  }
};

constexpr const char* flatten_name = "flatten";

/// (B, d1, d2, ...) -> (B, d1 * d2 * ...): a copy, so the output owns its storage like any other.
class flatten_op final : public op {
 public:
  const char* kind() const override { return flatten_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_image_input(flatten_name, in, types, 2, true, "(B, d1, ...)");
    return {in[0][0], numel_of(in[0]) / in[0][0]};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(flatten_name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_tensor_rank(flatten_name, x, 2, true, "(B, d1, ...)");
    check_tensor_shape(flatten_name, "output", a.output, {x.dim(0), x.numel() / x.dim(0)});
    dispatch_float(a.output->type(), flatten_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(flatten_name, &x, dtype_of<T>(), "input");
      std::copy_n(x.data<T>(), x.numel(), a.output->data<T>());
    });
  }

  bool backward_reads_inputs() const override { return false; }

  void backward(const backward_args& a) const override {
    check_backward_call(flatten_name, a, 1, 0);
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    const tensor& x = *dx;  // the input's shape (its values are freed after forward)
    check_tensor_rank(flatten_name, x, 2, true, "(B, d1, ...)");
    check_tensor_shape(flatten_name, "output grad", a.output_grad, {x.dim(0), x.numel() / x.dim(0)});
    dispatch_float(a.output_grad->type(), flatten_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(flatten_name, dx, dtype_of<T>(), "input grad");
      const T* dy = a.output_grad->data<T>();
      T* d = dx->data<T>();
      for (int64_t i = 0; i < x.numel(); ++i) d[i] += dy[i];
    });
  }

  /// No arithmetic forward (a copy), one add per element backward.
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(flatten_name, in, 1);
    const double n = static_cast<double>(numel_of(in[0])), f = cost_elem_bytes;
    op_cost c;
    c.flops_backward = n;
    c.output_bytes = n * f;
    c.bytes_forward = 2 * n * f;
    c.bytes_backward = 3 * n * f;
    return c;
  }
};

/// kernel (required), stride (default kernel) and padding (default 0, at most kernel / 2).
std::unique_ptr<op> make_pool2d_op(pool_mode mode, const attr_map& attrs) {
  const char* who = pool2d_op::name(mode);
  const int64_t k = positive_attr(attrs, who, "kernel");
  const int64_t s = with_op_name(who, [&] { return attrs.get_int("stride", k); });
  const int64_t p = with_op_name(who, [&] { return attrs.get_int("padding", 0); });
  if (s <= 0) throw op_error(std::string(who) + ": attribute 'stride' must be positive, got " + std::to_string(s));
  // Larger windows are typos (no image axis is that long); the bound keeps H + 2 * padding inside
  // int64 (found by tests/fuzz/fuzz_model.cpp).
  constexpr int64_t max_geometry = int64_t{1} << 31;
  for (auto [key, v] : {std::pair{"kernel", k}, std::pair{"stride", s}})
    if (v > max_geometry)
      throw op_error(std::string(who) + ": attribute '" + key + "' is " + std::to_string(v) +
                     ", more than the limit of 2^31");
  // Like PyTorch: more padding would allow windows made of padding only.
  if (p < 0 || p > k / 2)
    throw op_error(std::string(who) + ": attribute 'padding' must be in [0, kernel / 2] = [0, " +
                   std::to_string(k / 2) + "], got " + std::to_string(p));
  return std::make_unique<pool2d_op>(mode, k, s, p);
}

}  // namespace

std::unique_ptr<op> make_max_pool2d_cpu(const attr_map& attrs) { return make_pool2d_op(pool_mode::max, attrs); }

std::unique_ptr<op> make_avg_pool2d_cpu(const attr_map& attrs) { return make_pool2d_op(pool_mode::avg, attrs); }

std::unique_ptr<op> make_global_avg_pool_cpu(const attr_map&) { return std::make_unique<global_avg_pool_op>(); }

std::unique_ptr<op> make_flatten_cpu(const attr_map&) { return std::make_unique<flatten_op>(); }

}  // namespace fusion
