// Pooling (max, average, global average) and flatten: CUDA kernels and ops (CPU twin:
// ops/cpu/pool.cpp, contract in ops/pool.hpp).
//
// Shape legend: B batch, C channels, P = B * C planes of H x W input pixels, k kernel (square),
// s stride, p padding (<= k / 2: every window holds a real pixel), Ho x Wo output pixels.
//   max_pool2d, avg_pool2d: in (B, C, H, W) -> out (B, C, Ho, Wo); max saves argmax (B, C, Ho,
//     Wo) i32, the flat index h * W + w within the plane of each output's maximum
//   global_avg_pool: in (B, C, H, W) -> out (B, C)
//   flatten: in (B, d1, d2, ...) -> out (B, d1 * d2 * ...)
// Forward: one thread per output pixel, same window walk and comparisons as the CPU (the first
// maximum in row-major window order wins; a NaN beats any number, the first NaN stays).
// Backward gathers instead of scattering: each input pixel walks the windows that contain it in
// the CPU's output order and adds their contributions to its own gradient one by one, so no
// atomics are needed and the sums round exactly like the CPU's. Global average: one block per
// plane. Flatten: a device copy forward, dst += src backward.
#include <algorithm>
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

struct pool_geom {
  int64_t planes, H, W, k, s, p, Ho, Wo;
};

__device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// Output rows (or columns) whose window covers input row x: [lo, hi], clipped to [0, n_out).
__device__ inline void covering(int64_t x, int64_t k, int64_t s, int64_t p, int64_t n_out, int64_t& lo,
                               int64_t& hi) {
  const int64_t first = x + p - k + 1;  // oh * s - p + k - 1 >= x
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = imin((x + p) / s, n_out - 1);  // oh * s - p <= x
}

__global__ void max_pool_forward_kernel(float* out, int32_t* argmax, const float* in, pool_geom g) {
  const int64_t total = g.planes * g.Ho * g.Wo;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, pl = i / (g.Wo * g.Ho);
    const float* x = in + pl * g.H * g.W;
    const int64_t h0 = imax(ho * g.s - g.p, 0), h1 = imin(ho * g.s - g.p + g.k, g.H);
    const int64_t w0 = imax(wo * g.s - g.p, 0), w1 = imin(wo * g.s - g.p + g.k, g.W);
    // Padding is -infinity, so the first real pixel starts the scan; strict > keeps the first
    // of equal maxima.
    int64_t best_i = h0 * g.W + w0;
    float best = x[best_i];
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) {
        const float v = x[h * g.W + w];
        if (v > best || (isnan(v) && !isnan(best))) best = v, best_i = h * g.W + w;
      }
    out[i] = best;
    argmax[i] = static_cast<int32_t>(best_i);
  }
}

__global__ void max_pool_backward_kernel(float* din, const float* dout, const int32_t* argmax, pool_geom g) {
  const int64_t total = g.planes * g.H * g.W;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, pl = i / (g.W * g.H);
    const int64_t off = pl * g.Ho * g.Wo;
    int64_t ho0, ho1, wo0, wo1;
    covering(h, g.k, g.s, g.p, g.Ho, ho0, ho1);
    covering(w, g.k, g.s, g.p, g.Wo, wo0, wo1);
    const int32_t self = static_cast<int32_t>(h * g.W + w);
    float d = din[i];
    for (int64_t ho = ho0; ho <= ho1; ++ho)
      for (int64_t wo = wo0; wo <= wo1; ++wo)
        if (argmax[off + ho * g.Wo + wo] == self) d += dout[off + ho * g.Wo + wo];
    din[i] = d;
  }
}

__global__ void avg_pool_forward_kernel(float* out, const float* in, pool_geom g, float inv) {
  const int64_t total = g.planes * g.Ho * g.Wo;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, pl = i / (g.Wo * g.Ho);
    const float* x = in + pl * g.H * g.W;
    const int64_t h0 = imax(ho * g.s - g.p, 0), h1 = imin(ho * g.s - g.p + g.k, g.H);
    const int64_t w0 = imax(wo * g.s - g.p, 0), w1 = imin(wo * g.s - g.p + g.k, g.W);
    float sum = 0.0f;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += x[h * g.W + w];
    out[i] = sum * inv;  // padding counts in the divisor (count_include_pad)
  }
}

__global__ void avg_pool_backward_kernel(float* din, const float* dout, pool_geom g, float inv) {
  const int64_t total = g.planes * g.H * g.W;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, pl = i / (g.W * g.H);
    const int64_t off = pl * g.Ho * g.Wo;
    int64_t ho0, ho1, wo0, wo1;
    covering(h, g.k, g.s, g.p, g.Ho, ho0, ho1);
    covering(w, g.k, g.s, g.p, g.Wo, wo0, wo1);
    float d = din[i];
    for (int64_t ho = ho0; ho <= ho1; ++ho)
      // __fmul_rn: no fused multiply-add, so d rounds like the CPU's dx += dy * inv.
      for (int64_t wo = wo0; wo <= wo1; ++wo) d += __fmul_rn(dout[off + ho * g.Wo + wo], inv);
    din[i] = d;
  }
}

__global__ void global_avg_pool_forward_kernel(float* out, const float* in, int64_t planes, int64_t HW) {
  __shared__ float shared[32];
  for (int64_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) s += in[pl * HW + i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) out[pl] = s / static_cast<float>(HW);
  }
}

__global__ void global_avg_pool_backward_kernel(float* din, const float* dout, int64_t planes, int64_t HW) {
  const int64_t total = planes * HW;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    din[i] += dout[i / HW] / static_cast<float>(HW);
}

/// The ops of this file: one input, no parameters; the kind selects the kernels.
enum class pool_kind : uint8_t { max, avg, global_avg, flatten };

const char* name_of(pool_kind m) {
  switch (m) {
    case pool_kind::max: return "max_pool2d";
    case pool_kind::avg: return "avg_pool2d";
    case pool_kind::global_avg: return "global_avg_pool";
    case pool_kind::flatten: return "flatten";
  }
  return "?";
}

class pool_op final : public cuda_op {
 public:
  pool_op(pool_kind mode, const attr_map& attrs)
      : cuda_op(fusion::make_op(name_of(mode), attrs)),  // validates the attributes first
        mode_(mode),
        k_(windowed() ? attrs.get_int("kernel") : 1),
        s_(windowed() ? attrs.get_int("stride", k_) : 1),
        p_(windowed() ? attrs.get_int("padding", 0) : 0) {}

  void forward(const forward_args& a) const override {
    const char* who = name_of(mode_);
    cpu::check_forward_call(who, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_device_f32(who, "input", &x);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(who, a.output->type());
    check_device_f32_shape(who, "output", a.output, out);
    if (mode_ == pool_kind::max && a.saved == nullptr) throw op_error("max_pool2d: forward needs a saved list");
    const launch l = launch_of(a.ctx, who);
    const int64_t n_out = a.output->numel();
    if (mode_ == pool_kind::flatten) {
      CUDA_CHECK(cudaMemcpyAsync(a.output->f32(), x.f32(), x.nbytes(), cudaMemcpyDeviceToDevice, l.stream));
      return;
    }
    if (mode_ == pool_kind::global_avg) {
      const int64_t HW = x.dim(2) * x.dim(3);
      global_avg_pool_forward_kernel<<<rows_grid(n_out), row_threads(HW), 0, l.stream>>>(a.output->f32(), x.f32(),
                                                                                         n_out, HW);
      CUDA_CHECK_LAUNCH();
      return;
    }
    const pool_geom g = geom(x, out);
    if (mode_ == pool_kind::avg) {
      avg_pool_forward_kernel<<<grid_for(n_out), block_threads, 0, l.stream>>>(a.output->f32(), x.f32(), g, inv());
      CUDA_CHECK_LAUNCH();
      return;
    }
    a.saved->clear();
    a.saved->push_back(tensor::uninitialized(out, dtype::i32, device_kind::cuda));  // argmax
    max_pool_forward_kernel<<<grid_for(n_out), block_threads, 0, l.stream>>>(a.output->f32(), (*a.saved)[0].i32(),
                                                                            x.f32(), g);
    CUDA_CHECK_LAUNCH();
  }

  void backward(const backward_args& a) const override {
    const char* who = name_of(mode_);
    cpu::check_backward_call(who, a, 1, 0);
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    check_device_f32(who, "input grad", dx);
    const tensor& x = *dx;  // the input's shape (its values are freed after forward)
    const tensor* const shaped[] = {dx};
    const shape_t out = infer_from(shaped);
    check_device_f32_shape(who, "output grad", a.output_grad, out);
    const launch l = launch_of(a.ctx, who);
    const int64_t n_in = x.numel();
    if (mode_ == pool_kind::flatten) return add_inplace_cuda(dx->f32(), a.output_grad->f32(), n_in, l.stream);
    if (mode_ == pool_kind::global_avg) {
      global_avg_pool_backward_kernel<<<grid_for(n_in), block_threads, 0, l.stream>>>(
          dx->f32(), a.output_grad->f32(), a.output_grad->numel(), x.dim(2) * x.dim(3));
      CUDA_CHECK_LAUNCH();
      return;
    }
    const pool_geom g = geom(x, out);
    if (mode_ == pool_kind::avg) {
      avg_pool_backward_kernel<<<grid_for(n_in), block_threads, 0, l.stream>>>(dx->f32(), a.output_grad->f32(), g,
                                                                              inv());
      CUDA_CHECK_LAUNCH();
      return;
    }
    if (a.saved == nullptr || a.saved->size() != 1 || (*a.saved)[0].shape() != out ||
        (*a.saved)[0].type() != dtype::i32 || !(*a.saved)[0].is_cuda())
      throw op_error("max_pool2d: backward without the argmax indices saved by forward");
    max_pool_backward_kernel<<<grid_for(n_in), block_threads, 0, l.stream>>>(dx->f32(), a.output_grad->f32(),
                                                                            (*a.saved)[0].i32(), g);
    CUDA_CHECK_LAUNCH();
  }

 private:
  bool windowed() const { return mode_ == pool_kind::max || mode_ == pool_kind::avg; }
  // 1 / (k * k) in float, as the CPU's f32 kernel computes it.
  float inv() const { return 1.0f / static_cast<float>(k_ * k_); }

  pool_geom geom(const tensor& x, const shape_t& out) const {
    return {x.dim(0) * x.dim(1), x.dim(2), x.dim(3), k_, s_, p_, out[2], out[3]};
  }

  pool_kind mode_;
  int64_t k_, s_, p_;
};

}  // namespace

std::unique_ptr<op> make_max_pool2d_cuda(const attr_map& a) { return std::make_unique<pool_op>(pool_kind::max, a); }
std::unique_ptr<op> make_avg_pool2d_cuda(const attr_map& a) { return std::make_unique<pool_op>(pool_kind::avg, a); }
std::unique_ptr<op> make_global_avg_pool_cuda(const attr_map& a) {
  return std::make_unique<pool_op>(pool_kind::global_avg, a);
}
std::unique_ptr<op> make_flatten_cuda(const attr_map& a) { return std::make_unique<pool_op>(pool_kind::flatten, a); }

}  // namespace fusion::cuda
