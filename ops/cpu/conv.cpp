// 2-D convolution: CPU kernels (contract in ops/conv.hpp) and op.
//
// im2col + gemm. An image is unrolled into a column matrix col (Cin k k, Ho Wo) whose row
// (c, ki, kj) holds the pixels of channel c that kernel tap (ki, kj) meets at every output
// position, so group g of the convolution is one gemm W_g (Cout/G, Cin/G k k) x col_g. Backward
// rebuilds the same matrix for dW_g += dout_g col_g^T, and scatters dcol = W_g^T dout_g back
// into din (col2im). A 1x1, stride-1, unpadded convolution needs no unrolling: the image itself
// is its column matrix. Small images share a gemm, their column matrices side by side, so that
// a 7x7 stage still runs BLAS on wide matrices.
#include "ops/conv.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/blas.hpp"
#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

constexpr const char* conv2d_name = "conv2d";

namespace {

// Late ResNet stages have 14x14 or 7x7 outputs; a gemm only 49 columns wide runs far below
// BLAS's peak, so that many images share one gemm, side by side in the columns, until it is at
// least this wide (one image at 28x28 already is).
constexpr int64_t gemm_columns_target = 256;

// Output positions [lo, hi) along one axis whose input coordinate o*s + off lies in [0, n);
// the others read zero padding. Computed once per kernel tap so the copy loops stay branch-free.
struct index_range {
  int64_t lo, hi;
};

index_range valid_outputs(int64_t n, int64_t n_out, int64_t off, int64_t s) {
  const int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
  const int64_t top = n - 1 - off;  // largest admissible o*s
  const int64_t hi = std::min(n_out, top < 0 ? 0 : top / s + 1);
  return {std::min(lo, hi), hi};
}

// 1x1, stride 1, no padding: every row of the column matrix is one input channel.
bool is_pointwise(const conv2d_dims& d) { return d.k == 1 && d.stride == 1 && d.pad == 0; }

// Derived sizes of one call, shared by forward and backward.
struct conv_plan {
  int64_t P, HW, cin_g, cout_g, ckk_g, rows;  // rows = Cin k k: height of the whole column matrix
  int64_t per_gemm;                           // images side by side in one gemm
  bool pointwise;                             // 1x1, stride 1, no padding: no im2col needed
};

conv_plan make_plan(const conv2d_dims& d) {
  conv_plan p;
  p.P = d.Ho * d.Wo;
  p.HW = d.H * d.W;
  p.cin_g = d.Cin / d.groups;
  p.cout_g = d.Cout / d.groups;
  p.ckk_g = p.cin_g * d.k * d.k;
  p.rows = d.Cin * d.k * d.k;
  p.per_gemm = std::clamp<int64_t>((gemm_columns_target + p.P - 1) / p.P, 1, std::max<int64_t>(d.B, 1));
  p.pointwise = is_pointwise(d);
  blas_int(p.cout_g, conv2d_name);
  blas_int(p.ckk_g, conv2d_name);
  blas_int(p.per_gemm * p.P, conv2d_name);
  return p;
}

// Column and output scratch, reused across calls (an op actor runs one call at a time per
// thread), so a training step allocates nothing after the first micro-batch.
template <class T>
T* scratch(int which, int64_t n) {
  thread_local std::vector<T> bufs[2];
  std::vector<T>& v = bufs[which];
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Where kernel tap (ki, kj) reads, computed once per call rather than once per channel and
// tap (the divisions in valid_outputs, the fill and copy loop set-up, cost as much as the copy
// itself for the 4x4 and 7x7 images of late ResNet stages). Wide images copy row segments;
// narrow ones (Wo < narrow_width) gather through a table of input offsets, -1 for padding.
constexpr int64_t narrow_width = 8;

struct tap_geometry {
  std::vector<index_range> rh, rw;  // valid outputs per ki and per kj
  std::vector<int64_t> src;         // narrow images: k k P offsets into one input channel, or -1

  explicit tap_geometry(const conv2d_dims& d) {
    const int64_t P = d.Ho * d.Wo;
    for (int64_t t = 0; t < d.k; ++t) {
      rh.push_back(valid_outputs(d.H, d.Ho, t * d.dilation - d.pad, d.stride));
      rw.push_back(valid_outputs(d.W, d.Wo, t * d.dilation - d.pad, d.stride));
    }
    if (d.Wo >= narrow_width) return;
    src.assign(static_cast<size_t>(d.k * d.k * P), -1);
    for (int64_t ki = 0; ki < d.k; ++ki)
      for (int64_t kj = 0; kj < d.k; ++kj) {
        int64_t* tab = src.data() + (ki * d.k + kj) * P;
        for (int64_t oh = rh[ki].lo; oh < rh[ki].hi; ++oh)
          for (int64_t ow = rw[kj].lo; ow < rw[kj].hi; ++ow)
            tab[oh * d.Wo + ow] = (oh * d.stride + ki * d.dilation - d.pad) * d.W + ow * d.stride +
                                  kj * d.dilation - d.pad;
      }
  }
};

// Unrolls one image x (Cin, H, W) into col rows (c, ki, kj) of Ho*Wo elements, row stride ld.
template <class T>
void im2col(T* col, int64_t ld, const T* x, const conv2d_dims& d, const tap_geometry& g) {
  const int64_t s = d.stride, Wo = d.Wo, P = d.Ho * d.Wo, kk = d.k * d.k;
  if (is_pointwise(d)) {
    for (int64_t c = 0; c < d.Cin; ++c) std::copy_n(x + c * P, P, col + c * ld);
    return;
  }
  if (!g.src.empty()) {
    for (int64_t c = 0; c < d.Cin; ++c) {
      const T* xc = x + c * d.H * d.W;
      for (int64_t t = 0; t < kk; ++t) {
        const int64_t* tab = g.src.data() + t * P;
        T* row = col + (c * kk + t) * ld;
        for (int64_t o = 0; o < P; ++o) row[o] = tab[o] >= 0 ? xc[tab[o]] : T(0);
      }
    }
    return;
  }
  for (int64_t c = 0; c < d.Cin; ++c)
    for (int64_t ki = 0; ki < d.k; ++ki) {
      const int64_t offh = ki * d.dilation - d.pad;
      const index_range rh = g.rh[ki];
      for (int64_t kj = 0; kj < d.k; ++kj) {
        const int64_t offw = kj * d.dilation - d.pad;
        const index_range rw = g.rw[kj];
        T* row = col + ((c * d.k + ki) * d.k + kj) * ld;
        std::fill(row, row + rh.lo * Wo, T(0));
        std::fill(row + rh.hi * Wo, row + P, T(0));
        // Padding columns are a pixel or two per output row: strided stores down the rows,
        // rather than two tiny memset calls per row.
        for (int64_t o = 0; o < rw.lo; ++o)
          for (int64_t oh = rh.lo; oh < rh.hi; ++oh) row[oh * Wo + o] = T(0);
        for (int64_t o = rw.hi; o < Wo; ++o)
          for (int64_t oh = rh.lo; oh < rh.hi; ++oh) row[oh * Wo + o] = T(0);
        for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
          T* dst = row + oh * Wo;
          const T* src = x + (c * d.H + oh * s + offh) * d.W;  // indexed from o*s + offw >= 0
          // A separate unit-stride loop so the common case compiles to a vector copy.
          if (s == 1)
            for (int64_t o = rw.lo; o < rw.hi; ++o) dst[o] = src[o + offw];
          else
            for (int64_t o = rw.lo; o < rw.hi; ++o) dst[o] = src[o * s + offw];
        }
      }
    }
}

// The adjoint of im2col: adds every col element back onto the input pixel it was copied from.
template <class T>
void col2im_add(T* dx, const T* col, int64_t ld, const conv2d_dims& d, const tap_geometry& g) {
  const int64_t s = d.stride, Wo = d.Wo, P = d.Ho * d.Wo, kk = d.k * d.k;
  if (is_pointwise(d)) {
    for (int64_t c = 0; c < d.Cin; ++c) {
      T* dst = dx + c * P;
      const T* src = col + c * ld;
      for (int64_t o = 0; o < P; ++o) dst[o] += src[o];
    }
    return;
  }
  if (!g.src.empty()) {
    // A tap reads distinct pixels at distinct outputs, so the scatter has no collisions.
    for (int64_t c = 0; c < d.Cin; ++c) {
      T* xc = dx + c * d.H * d.W;
      for (int64_t t = 0; t < kk; ++t) {
        const int64_t* tab = g.src.data() + t * P;
        const T* row = col + (c * kk + t) * ld;
        for (int64_t o = 0; o < P; ++o)
          if (tab[o] >= 0) xc[tab[o]] += row[o];
      }
    }
    return;
  }
  for (int64_t c = 0; c < d.Cin; ++c)
    for (int64_t ki = 0; ki < d.k; ++ki) {
      const int64_t offh = ki * d.dilation - d.pad;
      const index_range rh = g.rh[ki];
      for (int64_t kj = 0; kj < d.k; ++kj) {
        const int64_t offw = kj * d.dilation - d.pad;
        const index_range rw = g.rw[kj];
        const T* row = col + ((c * d.k + ki) * d.k + kj) * ld;
        for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
          const T* src = row + oh * Wo;
          T* dst = dx + (c * d.H + oh * s + offh) * d.W;
          if (s == 1)
            for (int64_t o = rw.lo; o < rw.hi; ++o) dst[o + offw] += src[o];
          else
            for (int64_t o = rw.lo; o < rw.hi; ++o) dst[o * s + offw] += src[o];
        }
      }
    }
}

// The column matrix of images [b0, b0 + n) side by side (row stride n P), or the input itself
// for a single image of a pointwise convolution.
template <class T>
const T* columns(const T* in, int64_t b0, int64_t n, const conv_plan& p, const conv2d_dims& d,
                 const tap_geometry& g) {
  const T* x0 = in + b0 * d.Cin * p.HW;
  if (p.pointwise && n == 1) return x0;
  const int64_t ld = n * p.P;
  T* col = scratch<T>(0, p.rows * ld);
  for (int64_t i = 0; i < n; ++i) im2col(col + i * p.P, ld, x0 + i * d.Cin * p.HW, d, g);
  return col;
}

}  // namespace

template <class T>
void conv2d_forward_cpu(T* out, const T* in, const T* weight, const T* bias, const conv2d_dims& d) {
  if (d.B == 0) return;
  const conv_plan p = make_plan(d);
  const tap_geometry g(d);
  const int m = static_cast<int>(p.cout_g), kk = static_cast<int>(p.ckk_g);
  for (int64_t b0 = 0; b0 < d.B; b0 += p.per_gemm) {
    const int64_t n = std::min(p.per_gemm, d.B - b0), ld = n * p.P;
    const T* col = columns(in, b0, n, p, d, g);
    // One image writes its output in place (bias seeded, gemm accumulates onto it); several
    // go through a (Cout, n P) scratch that is then split per image.
    T* y = n == 1 ? out + b0 * d.Cout * p.P : scratch<T>(1, d.Cout * ld);
    T beta = 0;
    if (n == 1 && bias) {
      for (int64_t co = 0; co < d.Cout; ++co) std::fill(y + co * p.P, y + (co + 1) * p.P, bias[co]);
      beta = 1;
    }
    for (int64_t g = 0; g < d.groups; ++g)
      gemm(false, false, m, static_cast<int>(ld), kk, T(1), weight + g * p.cout_g * p.ckk_g, kk,
           col + g * p.ckk_g * ld, static_cast<int>(ld), beta, y + g * p.cout_g * ld, static_cast<int>(ld));
    if (n == 1) continue;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t co = 0; co < d.Cout; ++co) {
        T* dst = out + ((b0 + i) * d.Cout + co) * p.P;
        const T* src = y + co * ld + i * p.P;
        const T bv = bias ? bias[co] : T(0);
        for (int64_t j = 0; j < p.P; ++j) dst[j] = src[j] + bv;
      }
  }
}

template <class T>
void conv2d_backward_cpu(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                         const conv2d_dims& d) {
  if (d.B == 0) return;
  const conv_plan p = make_plan(d);
  if (dbias)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t co = 0; co < d.Cout; ++co) {
        const T* r = dout + (b * d.Cout + co) * p.P;
        dbias[co] += lane_sum<T>(p.P, [&](int64_t j) { return r[j]; });
      }
  if (!din && !dweight) return;
  const tap_geometry geo(d);
  const int m = static_cast<int>(p.cout_g), kk = static_cast<int>(p.ckk_g);
  for (int64_t b0 = 0; b0 < d.B; b0 += p.per_gemm) {
    const int64_t n = std::min(p.per_gemm, d.B - b0), ld = n * p.P;
    // dout of these images as one (Cout, n P) matrix, like the forward output.
    const T* dy = dout + b0 * d.Cout * p.P;
    if (n > 1) {
      T* g = scratch<T>(1, d.Cout * ld);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t co = 0; co < d.Cout; ++co)
          std::copy_n(dout + ((b0 + i) * d.Cout + co) * p.P, p.P, g + co * ld + i * p.P);
      dy = g;
    }
    if (dweight) {
      const T* col = columns(in, b0, n, p, d, geo);
      for (int64_t g = 0; g < d.groups; ++g)
        gemm(false, true, m, kk, static_cast<int>(ld), T(1), dy + g * p.cout_g * ld, static_cast<int>(ld),
             col + g * p.ckk_g * ld, static_cast<int>(ld), T(1), dweight + g * p.cout_g * p.ckk_g, kk);
    }
    if (!din) continue;
    T* dx0 = din + b0 * d.Cin * p.HW;
    if (p.pointwise && n == 1) {
      for (int64_t g = 0; g < d.groups; ++g)
        gemm(true, false, kk, static_cast<int>(ld), m, T(1), weight + g * p.cout_g * p.ckk_g, kk,
             dy + g * p.cout_g * ld, static_cast<int>(ld), T(1), dx0 + g * p.cin_g * p.HW, static_cast<int>(ld));
      continue;
    }
    // The weight-gradient gemm is done with the columns, so dcol may take their buffer.
    T* dcol = scratch<T>(0, p.rows * ld);
    for (int64_t g = 0; g < d.groups; ++g)
      gemm(true, false, kk, static_cast<int>(ld), m, T(1), weight + g * p.cout_g * p.ckk_g, kk,
           dy + g * p.cout_g * ld, static_cast<int>(ld), T(0), dcol + g * p.ckk_g * ld, static_cast<int>(ld));
    for (int64_t i = 0; i < n; ++i) col2im_add(dx0 + i * d.Cin * p.HW, dcol + i * p.P, ld, d, geo);
  }
}

template void conv2d_forward_cpu<float>(float*, const float*, const float*, const float*, const conv2d_dims&);
template void conv2d_forward_cpu<double>(double*, const double*, const double*, const double*, const conv2d_dims&);
template void conv2d_backward_cpu<float>(float*, float*, float*, const float*, const float*, const float*,
                                         const conv2d_dims&);
template void conv2d_backward_cpu<double>(double*, double*, double*, const double*, const double*, const double*,
                                          const conv2d_dims&);

namespace {

// Kernel, stride, padding and dilation above this are typos (no image axis is that long);
// refusing them keeps conv2d_out_size inside int64 (found by tests/fuzz/fuzz_model.cpp).
constexpr int64_t max_geometry = int64_t{1} << 31;

// Check that the geometry attribute `key` = `v` is at most max_geometry.
int64_t bounded(const char* key, int64_t v) {
  if (v > max_geometry)
    throw op_error(std::string(conv2d_name) + ": attribute '" + key + "' is " + std::to_string(v) +
                   ", more than the limit of 2^31");
  return v;
}

// Optional integer attribute of at least `min` (1 for sizes, 0 for padding).
int64_t int_attr(const attr_map& attrs, const char* key, int64_t fallback, int64_t min) {
  const int64_t v = with_op_name(conv2d_name, [&] { return attrs.get_int(key, fallback); });
  if (v < min)
    throw op_error(std::string(conv2d_name) + ": attribute '" + key + "' must be " +
                   (min == 1 ? std::string("positive") : ">= " + std::to_string(min)) + ", got " +
                   std::to_string(v));
  return v;
}

void check_type(const tensor* t, dtype want, const char* what) { check_tensor_dtype(conv2d_name, what, t, want); }

/// attrs: out, kernel (required), stride 1, padding 0, dilation 1, groups 1, bias true,
/// init_std sqrt(2 / (out k k)) (kaiming normal, fan_out, as torchvision's ResNet).
class conv2d_op final : public op {
 public:
  explicit conv2d_op(const attr_map& attrs)
      : out_(positive_attr(attrs, conv2d_name, "out")),
        k_(bounded("kernel", positive_attr(attrs, conv2d_name, "kernel"))),
        stride_(bounded("stride", int_attr(attrs, "stride", 1, 1))),
        pad_(bounded("padding", int_attr(attrs, "padding", 0, 0))),
        dilation_(bounded("dilation", int_attr(attrs, "dilation", 1, 1))),
        groups_(int_attr(attrs, "groups", 1, 1)),
        bias_(with_op_name(conv2d_name, [&] { return attrs.get_bool("bias", true); })),
        init_std_(with_op_name(conv2d_name, [&] {
          // In double: out_ * k_ * k_ can overflow int64.
          const double fan_out = static_cast<double>(out_) * static_cast<double>(k_ * k_);
          return attrs.get_float("init_std", std::sqrt(2.0 / fan_out));
        })) {
    if (!(init_std_ >= 0))
      throw op_error(std::string(conv2d_name) + ": attribute 'init_std' must be >= 0, got " +
                     std::to_string(init_std_));
    if (out_ % groups_ != 0)
      throw op_error(std::string(conv2d_name) + ": out=" + std::to_string(out_) +
                     " output channels are not divisible by groups=" + std::to_string(groups_));
  }

  const char* kind() const override { return conv2d_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(conv2d_name, in, types, 1);
    check_float_input(conv2d_name, types, 0);
    const conv2d_dims d = dims(in[0]);
    return {d.B, out_, d.Ho, d.Wo};
  }

  std::vector<param_spec> params(std::span<const shape_t> in) const override {
    if (in.size() != 1) throw op_error(std::string(conv2d_name) + ": params need one input shape (B, Cin, H, W)");
    const conv2d_dims d = dims(in[0]);
    std::vector<param_spec> ps{{"weight", weight_shape(d), param_init::normal, static_cast<float>(init_std_), true}};
    if (bias_) ps.push_back({"bias", {out_}, param_init::zeros, 0.0f, false});
    return ps;
  }

  void forward(const forward_args& a) const override {
    check_forward_call(conv2d_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    const conv2d_dims d = dims(x.shape());
    check_params(a.params, d);
    check_tensor_shape(conv2d_name, "output", a.output, {d.B, out_, d.Ho, d.Wo});
    dispatch_float(a.output->type(), conv2d_name, [&](auto tag) {
      using T = decltype(tag);
      check_types(x, a.params, dtype_of<T>());
      conv2d_forward_cpu(a.output->data<T>(), x.data<T>(), a.params[0]->data<T>(),
                         bias_ ? a.params[1]->data<T>() : nullptr, d);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(conv2d_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    const conv2d_dims d = dims(x.shape());
    check_params(a.params, d);
    check_tensor_shape(conv2d_name, "output grad", a.output_grad, {d.B, out_, d.Ho, d.Wo});
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = bias_ ? a.param_grads[1] : nullptr;
    if (dx) check_tensor_shape(conv2d_name, "input grad", dx, x.shape());
    if (dw) check_tensor_shape(conv2d_name, "weight grad", dw, weight_shape(d));
    if (db) check_tensor_shape(conv2d_name, "bias grad", db, {out_});
    dispatch_float(a.output_grad->type(), conv2d_name, [&](auto tag) {
      using T = decltype(tag);
      const dtype t = dtype_of<T>();
      check_types(x, a.params, t);
      if (dx) check_type(dx, t, "input grad");
      if (dw) check_type(dw, t, "weight grad");
      if (db) check_type(db, t, "bias grad");
      conv2d_backward_cpu(dx ? dx->data<T>() : nullptr, dw ? dw->data<T>() : nullptr, db ? db->data<T>() : nullptr,
                          a.output_grad->data<T>(), x.data<T>(), a.params[0]->data<T>(), d);
    });
  }

  /// Forward 2 B Cout Ho Wo (Cin/G) k k (+ B Cout Ho Wo bias adds); backward twice the gemm
  /// work (weight and input gradients) (+ B Cout Ho Wo for the bias gradient).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(conv2d_name, in, 1);
    const conv2d_dims d = dims(in[0]);
    const double X = static_cast<double>(d.B * d.Cin * d.H * d.W);
    const double Y = static_cast<double>(d.B * out_ * d.Ho * d.Wo);
    const double Wn = static_cast<double>(out_ * (d.Cin / groups_) * k_ * k_);
    const double nb = bias_ ? static_cast<double>(out_) : 0;
    const double macs = Y * static_cast<double>((d.Cin / groups_) * k_ * k_);
    op_cost c;
    c.flops_forward = 2 * macs + (bias_ ? Y : 0);
    c.flops_backward = 4 * macs + (bias_ ? Y : 0);
    c.param_bytes = (Wn + nb) * cost_elem_bytes;
    c.output_bytes = Y * cost_elem_bytes;
    c.bytes_forward = (X + Wn + nb + Y) * cost_elem_bytes;
    // Reads x, W, dy; read-modify-writes dx, dW, db.
    c.bytes_backward = (X + Wn + Y + 2 * (X + Wn + nb)) * cost_elem_bytes;
    return c;
  }

 private:
  size_t n_params() const { return bias_ ? 2 : 1; }

  shape_t weight_shape(const conv2d_dims& d) const { return {out_, d.Cin / groups_, k_, k_}; }

  // Validates an input shape against the attributes and derives the call's geometry.
  conv2d_dims dims(const shape_t& s) const {
    check_rank(conv2d_name, s, 0, 4, "(B, Cin, H, W)");
    conv2d_dims d{s[0], s[1], s[2], s[3], out_, k_, stride_, pad_, dilation_, groups_, 0, 0};
    if (d.Cin == 0) throw op_error(std::string(conv2d_name) + ": input " + to_string(s) + " has no channels");
    if (d.Cin % groups_ != 0)
      throw op_error(std::string(conv2d_name) + ": input channels " + std::to_string(d.Cin) +
                     " are not divisible by groups=" + std::to_string(groups_));
    d.Ho = conv2d_out_size(d.H, k_, stride_, pad_, dilation_);
    d.Wo = conv2d_out_size(d.W, k_, stride_, pad_, dilation_);
    if (d.Ho < 1 || d.Wo < 1)
      throw op_error(std::string(conv2d_name) + ": input of " + std::to_string(d.H) + "x" + std::to_string(d.W) +
                     " pixels is too small for kernel " + std::to_string(k_) + " with padding " +
                     std::to_string(pad_) + ", dilation " + std::to_string(dilation_) + " and stride " +
                     std::to_string(stride_) + " (output would be " + std::to_string(d.Ho) + "x" +
                     std::to_string(d.Wo) + ")");
    return d;
  }

  void check_params(std::span<const tensor* const> ps, const conv2d_dims& d) const {
    check_tensor_shape(conv2d_name, "param weight", ps[0], weight_shape(d));
    if (bias_) check_tensor_shape(conv2d_name, "param bias", ps[1], {out_});
  }

  void check_types(const tensor& x, std::span<const tensor* const> ps, dtype t) const {
    check_type(&x, t, "input");
    check_type(ps[0], t, "weight");
    if (bias_) check_type(ps[1], t, "bias");
  }

  int64_t out_, k_, stride_, pad_, dilation_, groups_;
  bool bias_;
  double init_std_;
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_conv2d_cpu(const attr_map& attrs) { return std::make_unique<cpu::conv2d_op>(attrs); }

}  // namespace fusion
