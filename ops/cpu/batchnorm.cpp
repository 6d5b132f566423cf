// Batch normalisation per channel: CPU kernels (contract in ops/batchnorm.hpp) and op.
#include "ops/batchnorm.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

// Memory order: every kernel walks the tensor as stored, run (b, c) after run (b, c + 1), each
// S values long, and keeps per-channel accumulators. Walking channel by channel instead jumps
// C S values between runs, which for the late ResNet stages (S = 16 or 49) costs a cache and
// TLB miss per run and left these kernels at 2-7 GB/s (RESULTS section 9).
//
// Precision: a run is summed in T with vec_lanes partial sums, in chunks of at most this many
// values, and the chunk sums are added up in double: a channel of a large batch holds millions
// of values, too many for a float accumulator, while a chunk is few enough.
constexpr int64_t chunk_max = 1024;

// Mean and centred sum of squares of one chunk x[0, n), both in double.
template <class T>
void chunk_moments(const T* x, int64_t n, double& mean, double& m2) {
  const T m = lane_sum<T>(n, [&](int64_t i) { return x[i]; }) / static_cast<T>(n);
  // Second read of a chunk that is still in L1: a centred sum, no E[x^2] - E[x]^2 cancellation.
  const T q = lane_sum<T>(n, [&](int64_t i) {
    const T d = x[i] - m;
    return d * d;
  });
  mean = static_cast<double>(m);
  m2 = static_cast<double>(q);
}

// Running mean and centred sum of squares of one channel, merged chunk by chunk with Chan et
// al.'s pairwise update (exact for the two-pass definition up to rounding).
struct moments {
  double n = 0, mean = 0, m2 = 0;

  void add(double nb, double mb, double m2b) {
    const double tot = n + nb, delta = mb - mean;
    mean += delta * (nb / tot);
    m2 += m2b + delta * delta * (n * nb / tot);
    n = tot;
  }
};

// sum dy and sum dy (x - m) over one chunk, added onto s1 and s2 in double.
template <class T>
void chunk_grad_sums(const T* dy, const T* x, int64_t n, T m, double& s1, double& s2) {
  s1 += static_cast<double>(lane_sum<T>(n, [&](int64_t i) { return dy[i]; }));
  s2 += static_cast<double>(lane_sum<T>(n, [&](int64_t i) { return dy[i] * (x[i] - m); }));
}

// Applies f(run pointer offset, channel) to every run in memory order.
template <class F>
void for_each_run(int64_t B, int64_t C, int64_t S, F f) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) f((b * C + c) * S, c);
}

// out = (in - mean[c]) * scale[c] + shift[c] over every run.
template <class T>
void normalise(T* out, const T* in, const T* mean, const T* scale, const T* shift, int64_t B, int64_t C,
               int64_t S) {
  for_each_run(B, C, S, [&](int64_t off, int64_t c) {
    const T m = mean[c], k = scale[c], t = shift[c];
    const T* x = in + off;
    T* y = out + off;
    for (int64_t i = 0; i < S; ++i) y[i] = (x[i] - m) * k + t;
  });
}

}  // namespace

template <class T>
void batchnorm_forward_train_cpu(T* out, T* mean, T* rstd, T* running_mean, T* running_var, const T* in,
                                 const T* w, const T* b, int64_t B, int64_t C, int64_t S, T eps, T momentum) {
  std::vector<moments> mom(static_cast<size_t>(C));
  for_each_run(B, C, S, [&](int64_t off, int64_t c) {
    for (int64_t i0 = 0; i0 < S; i0 += chunk_max) {
      const int64_t n = std::min(chunk_max, S - i0);
      double m, m2;
      chunk_moments(in + off + i0, n, m, m2);
      mom[c].add(static_cast<double>(n), m, m2);
    }
  });
  const double n = static_cast<double>(B * S), mo = static_cast<double>(momentum);
  std::vector<T> scale(C);
  for (int64_t c = 0; c < C; ++c) {
    const double m = mom[c].mean, v = mom[c].m2 / n;
    const double s = 1 / std::sqrt(v + static_cast<double>(eps));
    scale[c] = static_cast<T>(s * static_cast<double>(w[c]));
    mean[c] = static_cast<T>(m);
    rstd[c] = static_cast<T>(s);
    if (running_mean) running_mean[c] = static_cast<T>((1 - mo) * running_mean[c] + mo * m);
    if (running_var) running_var[c] = static_cast<T>((1 - mo) * running_var[c] + mo * v * n / (n - 1));
  }
  normalise(out, in, mean, scale.data(), b, B, C, S);
}

template <class T>
void batchnorm_forward_eval_cpu(T* out, const T* in, const T* w, const T* b, const T* running_mean,
                                const T* running_var, int64_t B, int64_t C, int64_t S, T eps) {
  std::vector<T> scale(C);
  for (int64_t c = 0; c < C; ++c) {
    const double s = 1 / std::sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps));
    scale[c] = static_cast<T>(s * static_cast<double>(w[c]));
  }
  normalise(out, in, running_mean, scale.data(), b, B, C, S);
}

template <class T>
void batchnorm_backward_cpu(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, const T* mean,
                            const T* rstd, int64_t B, int64_t C, int64_t S) {
  const double n = static_cast<double>(B * S);
  // The two channel reductions are dbias and dweight themselves and also the projection
  // terms of d(normalised)/d(in), through which every value of the channel depends on all.
  // sum dy xhat = rstd sum dy (x - mean): the centred product, summed once per value.
  std::vector<double> sum_dy(C, 0.0), sum_dy_xc(C, 0.0);
  for_each_run(B, C, S, [&](int64_t off, int64_t c) {
    for (int64_t i0 = 0; i0 < S; i0 += chunk_max)
      chunk_grad_sums(dout + off + i0, in + off + i0, std::min(chunk_max, S - i0), mean[c], sum_dy[c], sum_dy_xc[c]);
  });
  std::vector<T> k(C), g_mean(C), g_xc(C);
  for (int64_t c = 0; c < C; ++c) {
    const double s = static_cast<double>(rstd[c]), sum_dy_xhat = sum_dy_xc[c] * s;
    if (db) db[c] += static_cast<T>(sum_dy[c]);
    if (dw) dw[c] += static_cast<T>(sum_dy_xhat);
    k[c] = w[c] * rstd[c];
    g_mean[c] = static_cast<T>(sum_dy[c] / n);
    g_xc[c] = static_cast<T>(s * sum_dy_xhat / n);  // the xhat term's factor on (x - mean)
  }
  if (!din) return;
  for_each_run(B, C, S, [&](int64_t off, int64_t c) {
    const T m = mean[c], kc = k[c], gm = g_mean[c], gx = g_xc[c];
    const T* dy = dout + off;
    const T* x = in + off;
    T* dx = din + off;
    for (int64_t i = 0; i < S; ++i) dx[i] += kc * (dy[i] - gm - (x[i] - m) * gx);
  });
}

template void batchnorm_forward_train_cpu<float>(float*, float*, float*, float*, float*, const float*,
                                                 const float*, const float*, int64_t, int64_t, int64_t, float,
                                                 float);
template void batchnorm_forward_train_cpu<double>(double*, double*, double*, double*, double*, const double*,
                                                  const double*, const double*, int64_t, int64_t, int64_t, double,
                                                  double);
template void batchnorm_forward_eval_cpu<float>(float*, const float*, const float*, const float*, const float*,
                                                const float*, int64_t, int64_t, int64_t, float);
template void batchnorm_forward_eval_cpu<double>(double*, const double*, const double*, const double*,
                                                 const double*, const double*, int64_t, int64_t, int64_t, double);
template void batchnorm_backward_cpu<float>(float*, float*, float*, const float*, const float*, const float*,
                                            const float*, const float*, int64_t, int64_t, int64_t);
template void batchnorm_backward_cpu<double>(double*, double*, double*, const double*, const double*,
                                             const double*, const double*, const double*, int64_t, int64_t,
                                             int64_t);

}  // namespace fusion::cpu

namespace fusion {

namespace {

using namespace fusion::cpu;

constexpr const char* batchnorm_name = "batchnorm2d";

// Analytic per-element work (per-channel scalars are negligible): forward = mean 1 + variance 3
// + normalise and affine 4; backward = two reductions 5 + dinput 7.
constexpr double batchnorm_forward_flops_per_elem = 8;
constexpr double batchnorm_backward_flops_per_elem = 12;

void check_type(const tensor* t, dtype want, const char* what) { check_tensor_dtype(batchnorm_name, what, t, want); }

/// forward/backward index dim(1), so a tensor that bypassed infer_shape is caught here.
void check_input_rank(const tensor& in) {
  if (in.rank() < 2)
    throw op_error("batchnorm2d: input must have rank >= 2 (B, C, ...spatial), got " + to_string(in.shape()));
}

/// Product of the spatial dimensions of (B, C, ...spatial): 1 for a (B, C) input.
int64_t spatial_size(const shape_t& s) {
  int64_t n = 1;
  for (size_t i = 2; i < s.size(); ++i) n *= s[i];
  return n;
}

class batchnorm_op final : public op {
 public:
  batchnorm_op(double eps, double momentum) : eps_(eps), momentum_(momentum) {}

  const char* kind() const override { return batchnorm_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> inputs, std::span<const dtype> types) const override {
    check_arity(batchnorm_name, inputs, types, 1);
    check_float_input(batchnorm_name, types, 0);
    const shape_t& s = inputs[0];
    check_min_rank(batchnorm_name, s, 0, 2, "(B, C, ...spatial)");
    for (int64_t d : s)
      if (d <= 0) throw op_error("batchnorm2d: input shape " + to_string(s) + " has a non-positive dimension");
    return s;
  }

  std::vector<param_spec> params(std::span<const shape_t> inputs) const override {
    const int64_t C = channels(inputs);
    return {{"weight", {C}, param_init::ones, 0.02f, false}, {"bias", {C}, param_init::zeros, 0.02f, false}};
  }

  std::vector<buffer_spec> buffers(std::span<const shape_t> inputs) const override {
    const int64_t C = channels(inputs);
    return {{"running_mean", {C}, param_init::zeros}, {"running_var", {C}, param_init::ones}};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(batchnorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_input_rank(in);
    const shape_t c_shape{in.dim(1)};
    check_tensor_shape(batchnorm_name, "param weight", a.params[0], c_shape);
    check_tensor_shape(batchnorm_name, "param bias", a.params[1], c_shape);
    check_tensor_shape(batchnorm_name, "output", a.output, in.shape());
    // The actor always passes the running statistics; without them training would silently
    // leave nothing for evaluation to use.
    if (a.buffers.size() != 2)
      throw op_error("batchnorm2d: forward needs the 2 buffers running_mean and running_var, got " +
                     std::to_string(a.buffers.size()));
    check_tensor_shape(batchnorm_name, "buffer running_mean", a.buffers[0], c_shape);
    check_tensor_shape(batchnorm_name, "buffer running_var", a.buffers[1], c_shape);
    const int64_t B = in.dim(0), C = in.dim(1), S = spatial_size(in.shape());
    if (a.training && B * S < 2)
      throw op_error("batchnorm2d: training needs more than one value per channel, got input " +
                     to_string(in.shape()) + " (use a larger batch, or evaluation mode)");
    if (a.training && a.saved == nullptr) throw op_error("batchnorm2d: training forward needs a saved list");
    dispatch_float(a.output->type(), batchnorm_name, [&](auto tag) {
      using T = decltype(tag);
      const dtype t = dtype_of<T>();
      check_type(&in, t, "input");
      check_type(a.params[0], t, "weight");
      check_type(a.params[1], t, "bias");
      check_type(a.buffers[0], t, "running_mean");
      check_type(a.buffers[1], t, "running_var");
      const T* x = in.data<T>();
      const T* w = a.params[0]->data<T>();
      const T* b = a.params[1]->data<T>();
      T* rm = a.buffers[0]->data<T>();
      T* rv = a.buffers[1]->data<T>();
      if (a.saved) a.saved->clear();  // an evaluation forward leaves nothing for backward
      if (!a.training) {
        batchnorm_forward_eval_cpu<T>(a.output->data<T>(), x, w, b, rm, rv, B, C, S, static_cast<T>(eps_));
        return;
      }
      a.saved->emplace_back(c_shape, t);  // mean
      a.saved->emplace_back(c_shape, t);  // rstd
      batchnorm_forward_train_cpu<T>(a.output->data<T>(), (*a.saved)[0].data<T>(), (*a.saved)[1].data<T>(), rm,
                                     rv, x, w, b, B, C, S, static_cast<T>(eps_), static_cast<T>(momentum_));
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(batchnorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_input_rank(in);
    const shape_t c_shape{in.dim(1)};
    check_tensor_shape(batchnorm_name, "param weight", a.params[0], c_shape);
    check_tensor_shape(batchnorm_name, "output grad", a.output_grad, in.shape());
    tensor* din = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = a.param_grads[1];
    if (din) check_tensor_shape(batchnorm_name, "input grad", din, in.shape());
    if (dw) check_tensor_shape(batchnorm_name, "weight grad", dw, c_shape);
    if (db) check_tensor_shape(batchnorm_name, "bias grad", db, c_shape);
    const int64_t B = in.dim(0), C = in.dim(1), S = spatial_size(in.shape());
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != C || (*a.saved)[1].numel() != C)
      throw op_error("batchnorm2d: backward needs the batch mean/rstd saved by a training-mode forward "
                     "(an evaluation-mode forward saves none)");
    dispatch_float(a.output_grad->type(), batchnorm_name, [&](auto tag) {
      using T = decltype(tag);
      const dtype t = dtype_of<T>();
      check_type(&in, t, "input");
      check_type(a.params[0], t, "weight");
      check_type(&(*a.saved)[0], t, "saved mean");
      check_type(&(*a.saved)[1], t, "saved rstd");
      if (din) check_type(din, t, "input grad");
      if (dw) check_type(dw, t, "weight grad");
      if (db) check_type(db, t, "bias grad");
      batchnorm_backward_cpu<T>(din ? din->data<T>() : nullptr, dw ? dw->data<T>() : nullptr,
                                db ? db->data<T>() : nullptr, a.output_grad->data<T>(), in.data<T>(),
                                a.params[0]->data<T>(), (*a.saved)[0].data<T>(), (*a.saved)[1].data<T>(), B, C, S);
    });
  }

  /// Forward 8 flops per element, backward 12 (see the constants above).
  op_cost cost(std::span<const shape_t> inputs) const override {
    check_cost_call(batchnorm_name, inputs, 1);
    const double n = static_cast<double>(numel_of(inputs[0]));
    const double C = static_cast<double>(channels(inputs)), f = cost_elem_bytes;
    op_cost c;
    c.flops_forward = batchnorm_forward_flops_per_elem * n;
    c.flops_backward = batchnorm_backward_flops_per_elem * n;
    c.param_bytes = 2 * C * f;
    c.output_bytes = n * f;
    // forward: read in + params, write out + stats, read-modify-write the running statistics;
    // backward: read dout, in, weight, stats, read-modify-write din, dweight, dbias.
    c.bytes_forward = (2 * n + 8 * C) * f;
    c.bytes_backward = (4 * n + 7 * C) * f;
    return c;
  }

 private:
  static int64_t channels(std::span<const shape_t> inputs) {
    if (inputs.size() != 1 || inputs[0].size() < 2)
      throw op_error("batchnorm2d: params and buffers need one input shape (B, C, ...spatial)");
    return inputs[0][1];
  }

  double eps_;
  double momentum_;
};

}  // namespace

std::unique_ptr<op> make_batchnorm2d_cpu(const attr_map& attrs) {
  const double eps = with_op_name(batchnorm_name, [&] { return attrs.get_float("eps", 1e-5); });
  if (!(eps > 0)) throw op_error("batchnorm2d: attribute 'eps' must be > 0, got " + attrs.get_string("eps", ""));
  const double momentum = with_op_name(batchnorm_name, [&] { return attrs.get_float("momentum", 0.1); });
  if (!(momentum >= 0 && momentum <= 1))
    throw op_error("batchnorm2d: attribute 'momentum' must be in [0, 1], got " + attrs.get_string("momentum", ""));
  return std::make_unique<batchnorm_op>(eps, momentum);
}

}  // namespace fusion
