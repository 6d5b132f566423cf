// Batch normalisation per channel: CUDA kernels and op (CPU twin: ops/cpu/batchnorm.cpp,
// contract in ops/batchnorm.hpp).
//
// Shape legend: B batch, C channels, S = product of the spatial dims (1 for a (B, C) input),
// n = B * S values per channel.
//   in (B, C, ...spatial), weight (C), bias (C) -> out like in
//   buffers running_mean (C), running_var (C); saved (training only) mean (C), rstd (C)
// One block per channel, reductions in double like the CPU (a channel of a large batch holds
// millions of values) and the same float/double conversions in the same places, so the two
// backends differ only in summation order. Training: two passes (mean, then centred variance),
// then normalise and update the running statistics in place (unbiased variance n / (n - 1)).
// Evaluation normalises with the running statistics and saves nothing. Backward: the two
// channel sums (dbias, dweight) then din, all accumulating (+=).
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* batchnorm_name = "batchnorm2d";

// Flat index of value j in [0, n) of channel c.
__device__ inline int64_t channel_index(int64_t j, int64_t C, int64_t S, int64_t c) {
  return ((j / S) * C + c) * S + j % S;
}

__global__ void batchnorm_train_kernel(float* out, float* mean, float* rstd, float* running_mean,
                                       float* running_var, const float* in, const float* w, const float* b,
                                       int64_t B, int64_t C, int64_t S, float eps, float momentum) {
  __shared__ double shared[32];
  const int64_t n = B * S;
  const double nd = static_cast<double>(n);
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += static_cast<double>(in[channel_index(j, C, S, c)]);
    const double m = block_sum(s, shared) / nd;
    double v = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = static_cast<double>(in[channel_index(j, C, S, c)]) - m;
      v += d * d;
    }
    const double var = block_sum(v, shared) / nd;
    const double sd = 1 / sqrt(var + static_cast<double>(eps));
    const float mt = static_cast<float>(m), scale = static_cast<float>(sd * static_cast<double>(w[c])), shift = b[c];
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = channel_index(j, C, S, c);
      out[i] = (in[i] - mt) * scale + shift;
    }
    if (threadIdx.x == 0) {
      mean[c] = mt;
      rstd[c] = static_cast<float>(sd);
      const double mom = static_cast<double>(momentum);
      running_mean[c] = static_cast<float>((1 - mom) * running_mean[c] + mom * m);
      running_var[c] = static_cast<float>((1 - mom) * running_var[c] + mom * var * nd / (nd - 1));
    }
  }
}

__global__ void batchnorm_eval_kernel(float* out, const float* in, const float* w, const float* b,
                                      const float* running_mean, const float* running_var, int64_t B, int64_t C,
                                      int64_t S, float eps) {
  const int64_t n = B * S;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    const double sd = 1 / sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps));
    const float mt = running_mean[c], scale = static_cast<float>(sd * static_cast<double>(w[c])), shift = b[c];
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = channel_index(j, C, S, c);
      out[i] = (in[i] - mt) * scale + shift;
    }
  }
}

__global__ void batchnorm_backward_kernel(float* din, float* dw, float* db, const float* dout, const float* in,
                                          const float* w, const float* mean, const float* rstd, int64_t B,
                                          int64_t C, int64_t S) {
  __shared__ double shared[32];
  const int64_t n = B * S;
  const double nd = static_cast<double>(n);
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    const float m = mean[c], s = rstd[c];
    double a = 0, g = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = channel_index(j, C, S, c);
      a += static_cast<double>(dout[i]);
      g += static_cast<double>(dout[i]) * static_cast<double>((in[i] - m) * s);
    }
    const double sum_dy = block_sum(a, shared);
    const double sum_dy_xhat = block_sum(g, shared);
    if (threadIdx.x == 0) {
      if (db) db[c] += static_cast<float>(sum_dy);
      if (dw) dw[c] += static_cast<float>(sum_dy_xhat);
    }
    if (!din) continue;
    // Every value of the channel depends on all through the batch mean and variance: the two
    // sums above are the projection terms of d(normalised)/d(in).
    const float k = w[c] * s, g_mean = static_cast<float>(sum_dy / nd), g_xhat = static_cast<float>(sum_dy_xhat / nd);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t i = channel_index(j, C, S, c);
      din[i] += k * (dout[i] - g_mean - (in[i] - m) * s * g_xhat);
    }
  }
}

/// Product of the spatial dimensions of (B, C, ...spatial): 1 for a (B, C) input.
int64_t spatial_size(const shape_t& s) {
  int64_t n = 1;
  for (size_t i = 2; i < s.size(); ++i) n *= s[i];
  return n;
}

class batchnorm_op final : public cuda_op {
 public:
  explicit batchnorm_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(batchnorm_name, attrs)),  // validates eps and momentum first
        eps_(static_cast<float>(attrs.get_float("eps", 1e-5))),
        momentum_(static_cast<float>(attrs.get_float("momentum", 0.1))) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(batchnorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_device_f32(batchnorm_name, "input", &in);
    infer_from(a.inputs);
    check_f32_call(batchnorm_name, a.output->type());
    const shape_t c_shape{in.dim(1)};
    check_device_f32_shape(batchnorm_name, "param weight", a.params[0], c_shape);
    check_device_f32_shape(batchnorm_name, "param bias", a.params[1], c_shape);
    check_device_f32_shape(batchnorm_name, "output", a.output, in.shape());
    // The actor always passes the running statistics; without them training would silently
    // leave nothing for evaluation to use.
    if (a.buffers.size() != 2)
      throw op_error("batchnorm2d: forward needs the 2 buffers running_mean and running_var, got " +
                     std::to_string(a.buffers.size()));
    check_device_f32_shape(batchnorm_name, "buffer running_mean", a.buffers[0], c_shape);
    check_device_f32_shape(batchnorm_name, "buffer running_var", a.buffers[1], c_shape);
    const int64_t B = in.dim(0), C = in.dim(1), S = spatial_size(in.shape());
    if (a.training && B * S < 2)
      throw op_error("batchnorm2d: training needs more than one value per channel, got input " +
                     to_string(in.shape()) + " (use a larger batch, or evaluation mode)");
    if (a.training && a.saved == nullptr) throw op_error("batchnorm2d: training forward needs a saved list");
    const launch l = launch_of(a.ctx, batchnorm_name);
    if (a.saved) a.saved->clear();  // an evaluation forward leaves nothing for backward
    if (!a.training) {
      batchnorm_eval_kernel<<<rows_grid(C), row_threads(B * S), 0, l.stream>>>(
          a.output->f32(), in.f32(), a.params[0]->f32(), a.params[1]->f32(), a.buffers[0]->f32(),
          a.buffers[1]->f32(), B, C, S, eps_);
      CUDA_CHECK_LAUNCH();
      return;
    }
    a.saved->push_back(tensor::uninitialized(c_shape, dtype::f32, device_kind::cuda));  // mean
    a.saved->push_back(tensor::uninitialized(c_shape, dtype::f32, device_kind::cuda));  // rstd
    batchnorm_train_kernel<<<rows_grid(C), row_threads(B * S), 0, l.stream>>>(
        a.output->f32(), (*a.saved)[0].f32(), (*a.saved)[1].f32(), a.buffers[0]->f32(), a.buffers[1]->f32(),
        in.f32(), a.params[0]->f32(), a.params[1]->f32(), B, C, S, eps_, momentum_);
    CUDA_CHECK_LAUNCH();
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(batchnorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_device_f32(batchnorm_name, "input", &in);
    infer_from(a.inputs);
    const shape_t c_shape{in.dim(1)};
    check_device_f32_shape(batchnorm_name, "param weight", a.params[0], c_shape);
    check_device_f32_shape(batchnorm_name, "output grad", a.output_grad, in.shape());
    tensor* din = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = a.param_grads[1];
    if (din) check_device_f32_shape(batchnorm_name, "input grad", din, in.shape());
    if (dw) check_device_f32_shape(batchnorm_name, "weight grad", dw, c_shape);
    if (db) check_device_f32_shape(batchnorm_name, "bias grad", db, c_shape);
    const int64_t B = in.dim(0), C = in.dim(1), S = spatial_size(in.shape());
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != C || (*a.saved)[1].numel() != C)
      throw op_error("batchnorm2d: backward needs the batch mean/rstd saved by a training-mode forward "
                     "(an evaluation-mode forward saves none)");
    check_device_f32(batchnorm_name, "saved mean", &(*a.saved)[0]);
    check_device_f32(batchnorm_name, "saved rstd", &(*a.saved)[1]);
    if (!din && !dw && !db) return;
    const launch l = launch_of(a.ctx, batchnorm_name);
    batchnorm_backward_kernel<<<rows_grid(C), row_threads(B * S), 0, l.stream>>>(
        din ? din->f32() : nullptr, dw ? dw->f32() : nullptr, db ? db->f32() : nullptr, a.output_grad->f32(),
        in.f32(), a.params[0]->f32(), (*a.saved)[0].f32(), (*a.saved)[1].f32(), B, C, S);
    CUDA_CHECK_LAUNCH();
  }

 private:
  float eps_, momentum_;  // float like the CPU's f32 call, which narrows both first
};

}  // namespace

std::unique_ptr<op> make_batchnorm2d_cuda(const attr_map& attrs) { return std::make_unique<batchnorm_op>(attrs); }

}  // namespace fusion::cuda
