// 2-D convolution, NCHW: CUDA kernels and op (CPU twin: ops/cpu/conv.cpp).
//
// Shape legend: B batch, C input channels, H x W input pixels, O output channels, G groups,
// CG = C / G and OG = O / G channels per group, k kernel size (square), L = Ho * Wo output
// pixels, KC = C * k * k and KG = CG * k * k rows of an image's column matrix.
//   in (B, C, H, W), weight (O, CG, k, k), bias (O) -> out (B, O, Ho, Wo)
//   Ho = (H + 2 * padding - dilation * (k - 1) - 1) / stride + 1 (same for Wo)
// Forward: im2col of a chunk of images into col (nb, KC, L), then per group one strided-batched
// GEMM over the chunk: out[b, group] (OG, L) = W[group] (OG, KG) x col[b, group] (KG, L), onto
// rows seeded with the bias. Backward recomputes col: dW[group] += dy[b, group] x col[b, group]^T
// image by image (beta = 1, a fixed order; an image's groups in one batched GEMM), then per
// chunk and group dcol = W^T x dy (batched over the images) and a gathering col2im (each input
// pixel sums its own contributions: no atomics); db by one block per output channel. A 1x1
// convolution with stride 1 and no padding uses the input as its col (no im2col or col2im).
#include <algorithm>
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* conv_name = "conv2d";

// The column buffer of one chunk holds at most this many floats (128 MiB); a chunk always
// takes at least one image.
constexpr int64_t col_budget = int64_t(1) << 25;

struct conv_geom {
  int64_t B, C, H, W, O, G, k, stride, pad, dil, Ho, Wo;
  __host__ __device__ int64_t L() const { return Ho * Wo; }
  __host__ __device__ int64_t CG() const { return C / G; }
  __host__ __device__ int64_t OG() const { return O / G; }
  __host__ __device__ int64_t KG() const { return CG() * k * k; }
  __host__ __device__ int64_t KC() const { return C * k * k; }
  __host__ __device__ bool direct() const { return k == 1 && stride == 1 && pad == 0; }  // col == input
  int64_t chunk() const { return std::clamp<int64_t>(col_budget / std::max<int64_t>(1, KC() * L()), 1, B); }
};

// col[b, (c*k + kh)*k + kw, oh*Wo + ow] = in[b0 + b, c, oh*s - p + kh*d, ow*s - p + kw*d] or 0
// outside the image.
__global__ void im2col_kernel(float* col, const float* in, conv_geom g, int64_t nb) {
  const int64_t L = g.L(), KC = g.KC(), total = nb * KC * L;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i % L, row = (i / L) % KC, b = i / (L * KC);
    const int64_t kw = row % g.k, kh = (row / g.k) % g.k, c = row / (g.k * g.k);
    const int64_t oh = l / g.Wo, ow = l % g.Wo;
    const int64_t h = oh * g.stride - g.pad + kh * g.dil, w = ow * g.stride - g.pad + kw * g.dil;
    col[i] = (h >= 0 && h < g.H && w >= 0 && w < g.W) ? in[((b * g.C + c) * g.H + h) * g.W + w] : 0.0f;
  }
}

// din[b0 + b, c, h, w] += sum of dcol[b, (c*k + kh)*k + kw, oh*Wo + ow] over the taps with
// oh*s - p + kh*d == h and ow*s - p + kw*d == w, in (kh, kw) order.
__global__ void col2im_kernel(float* din, const float* dcol, conv_geom g, int64_t nb) {
  const int64_t L = g.L(), KC = g.KC(), HW = g.H * g.W, total = nb * g.C * HW;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, c = (i / HW) % g.C, b = i / (HW * g.C);
    const float* src = dcol + b * KC * L + c * g.k * g.k * L;
    float acc = 0.0f;
    for (int64_t kh = 0; kh < g.k; ++kh) {
      const int64_t th = h + g.pad - kh * g.dil;
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.Ho) continue;
      const int64_t oh = th / g.stride;
      for (int64_t kw = 0; kw < g.k; ++kw) {
        const int64_t tw = w + g.pad - kw * g.dil;
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.Wo) continue;
        acc += src[(kh * g.k + kw) * L + oh * g.Wo + tw / g.stride];
      }
    }
    din[i] += acc;
  }
}

// out[b, o, l] = bias[o]: the GEMMs then accumulate onto it (beta = 1).
__global__ void seed_bias_kernel(float* out, const float* bias, int64_t total, int64_t O, int64_t L) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bias[(i / L) % O];
}

// db[o] += sum over b, l of dout[b, o, l]; one block per output channel, fixed order.
__global__ void bias_grad_kernel(float* db, const float* dout, int64_t B, int64_t O, int64_t L) {
  __shared__ float shared[32];
  for (int64_t o = blockIdx.x; o < O; o += gridDim.x) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < B * L; i += blockDim.x) s += dout[((i / L) * O + o) * L + i % L];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) db[o] += s;
  }
}

void conv2d_forward_cuda(float* out, const float* in, const float* weight, const float* bias, const conv_geom& g,
                         const launch& l) {
  const int64_t L = g.L(), KC = g.KC(), KG = g.KG(), OG = g.OG();
  if (g.B == 0 || L == 0 || g.O == 0) return;
  const int m = cpu::blas_int(OG, conv_name), n = cpu::blas_int(L, conv_name), k = cpu::blas_int(KG, conv_name);
  float beta = 0.0f;  // beta = 0: cuBLAS never reads the (poisoned) output
  if (bias) {
    seed_bias_kernel<<<grid_for(g.B * g.O * L), block_threads, 0, l.stream>>>(out, bias, g.B * g.O * L, g.O, L);
    CUDA_CHECK_LAUNCH();
    beta = 1.0f;
  }
  const int64_t nb_max = g.chunk();
  tensor col;  // freed stream-ordered after the last GEMM that reads it
  if (!g.direct()) col = tensor::uninitialized({nb_max, KC, L}, dtype::f32, device_kind::cuda);
  for (int64_t b0 = 0; b0 < g.B; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.B - b0);
    const float* cols = in + b0 * KC * L;  // direct: the input is its own column matrix
    if (!g.direct()) {
      im2col_kernel<<<grid_for(nb * KC * L), block_threads, 0, l.stream>>>(col.f32(), in + b0 * g.C * g.H * g.W, g,
                                                                          nb);
      CUDA_CHECK_LAUNCH();
      cols = col.f32();
    }
    for (int64_t grp = 0; grp < g.G; ++grp)
      gemm_batched(l, false, false, m, n, k, 1.0f, weight + grp * OG * KG, k, 0, cols + grp * KG * L, n, KC * L,
                   beta, out + (b0 * g.O + grp * OG) * L, n, g.O * L, cpu::blas_int(nb, conv_name));
  }
}

void conv2d_backward_cuda(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const conv_geom& g, const launch& l) {
  const int64_t L = g.L(), KC = g.KC(), KG = g.KG(), OG = g.OG();
  if (g.B == 0 || L == 0 || g.O == 0) return;
  const int og = cpu::blas_int(OG, conv_name), n = cpu::blas_int(L, conv_name), kg = cpu::blas_int(KG, conv_name);
  if (dbias) {
    bias_grad_kernel<<<rows_grid(g.O), row_threads(g.B * L), 0, l.stream>>>(dbias, dout, g.B, g.O, L);
    CUDA_CHECK_LAUNCH();
  }
  if (!din && !dweight) return;
  const int64_t nb_max = g.chunk();
  tensor col;  // col for dweight, then reused as dcol for din (stream order keeps them apart)
  if (!g.direct()) col = tensor::uninitialized({nb_max, KC, L}, dtype::f32, device_kind::cuda);
  for (int64_t b0 = 0; b0 < g.B; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.B - b0);
    const float* dy = dout + b0 * g.O * L;
    if (dweight) {
      const float* cols = in + b0 * KC * L;
      if (!g.direct()) {
        im2col_kernel<<<grid_for(nb * KC * L), block_threads, 0, l.stream>>>(col.f32(), in + b0 * g.C * g.H * g.W,
                                                                            g, nb);
        CUDA_CHECK_LAUNCH();
        cols = col.f32();
      }
      // dW[group] (OG, KG) += dy[b, group] (OG, L) x col[b, group]^T (L, KG): image by image
      // (every image adds into the same dW), the groups of one image batched (disjoint dW blocks).
      for (int64_t b = 0; b < nb; ++b)
        gemm_batched(l, false, true, og, kg, n, 1.0f, dy + b * g.O * L, n, OG * L, cols + b * KC * L, n, KG * L,
                     1.0f, dweight, kg, OG * KG, cpu::blas_int(g.G, conv_name));
    }
    if (din) {
      // dcol[b, group] (KG, L) = W[group]^T (KG, OG) x dy[b, group] (OG, L); a direct convolution
      // accumulates straight into din (its col is the input).
      float* dcol = g.direct() ? din + b0 * KC * L : col.f32();
      const float beta = g.direct() ? 1.0f : 0.0f;
      for (int64_t grp = 0; grp < g.G; ++grp)
        gemm_batched(l, true, false, kg, n, og, 1.0f, weight + grp * OG * KG, kg, 0, dy + grp * OG * L, n,
                     g.O * L, beta, dcol + grp * KG * L, n, KC * L, cpu::blas_int(nb, conv_name));
      if (!g.direct()) {
        col2im_kernel<<<grid_for(nb * g.C * g.H * g.W), block_threads, 0, l.stream>>>(
            din + b0 * g.C * g.H * g.W, col.f32(), g, nb);
        CUDA_CHECK_LAUNCH();
      }
    }
  }
}

class conv2d_op final : public cuda_op {
 public:
  explicit conv2d_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(conv_name, attrs)),  // validates the attributes first
        out_(attrs.get_int("out")),
        k_(attrs.get_int("kernel")),
        stride_(attrs.get_int("stride", 1)),
        pad_(attrs.get_int("padding", 0)),
        dil_(attrs.get_int("dilation", 1)),
        groups_(attrs.get_int("groups", 1)),
        bias_(attrs.get_bool("bias", true)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(conv_name, a, 1, n_params());
    check_device_f32(conv_name, "input", a.inputs[0]);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(conv_name, a.output->type());
    check_params(a.params, *a.inputs[0]);
    check_device_f32_shape(conv_name, "output", a.output, out);
    if (a.saved) a.saved->clear();  // backward recomputes the column matrix instead of keeping it
    conv2d_forward_cuda(a.output->f32(), a.inputs[0]->f32(), a.params[0]->f32(),
                        bias_ ? a.params[1]->f32() : nullptr, geom(*a.inputs[0], out), launch_of(a.ctx, conv_name));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(conv_name, a, 1, n_params());
    const tensor& x = *a.inputs[0];
    check_device_f32(conv_name, "input", &x);
    const shape_t out = infer_from(a.inputs);
    check_params(a.params, x);
    check_device_f32_shape(conv_name, "output grad", a.output_grad, out);
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = bias_ ? a.param_grads[1] : nullptr;
    if (dx) check_device_f32_shape(conv_name, "input grad", dx, x.shape());
    if (dw) check_device_f32_shape(conv_name, "weight grad", dw, a.params[0]->shape());
    if (db) check_device_f32_shape(conv_name, "bias grad", db, {out_});
    conv2d_backward_cuda(dx ? dx->f32() : nullptr, dw ? dw->f32() : nullptr, db ? db->f32() : nullptr,
                         a.output_grad->f32(), x.f32(), a.params[0]->f32(), geom(x, out), launch_of(a.ctx, conv_name));
  }

 private:
  size_t n_params() const { return bias_ ? 2 : 1; }

  conv_geom geom(const tensor& x, const shape_t& out) const {
    return {x.dim(0), x.dim(1), x.dim(2), x.dim(3), out_, groups_, k_, stride_, pad_, dil_, out[2], out[3]};
  }

  void check_params(std::span<const tensor* const> ps, const tensor& x) const {
    check_device_f32_shape(conv_name, "param weight", ps[0], {out_, x.dim(1) / groups_, k_, k_});
    if (bias_) check_device_f32_shape(conv_name, "param bias", ps[1], {out_});
  }

  int64_t out_, k_, stride_, pad_, dil_, groups_;
  bool bias_;
};

}  // namespace

std::unique_ptr<op> make_conv2d_cuda(const attr_map& attrs) { return std::make_unique<conv2d_op>(attrs); }

}  // namespace fusion::cuda
