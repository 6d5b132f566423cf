// Multi-head (causal) self-attention: CUDA kernels and op (CPU twin: ops/cpu/attention.cpp).
//
// Shape legend: B batch, T time, C channels, NH heads, HS = C / NH head size, C3 = 3C.
//   qkv (B, T, 3C) -> out (B, T, C); saved: fused path lse (B, NH, T) and a copy of out,
//   cuBLAS path att (B, NH, T, T) softmax probabilities
// Layout as on the CPU: for batch b, head h, time t, the query is qkv[b, t, h*HS .. h*HS+HS),
// the key the same at offset C, the value at offset 2C; the head's output goes to
// out[b, t, h*HS .. h*HS+HS). Scores are S = QK^T / sqrt(HS); masked entries (j > t when
// causal) of att are exactly 0.
//
// Two paths. The fused one (ops/cuda/attention_flash.cu) is taken for head sizes up to 128
// when its tiles fit the device's shared memory: no T x T tensor, saved {lse (B, NH, T), out}.
// Otherwise (or with FUSION_CUDA_ATTENTION=gemm in the environment, to compare the two) the
// cuBLAS path below runs and saves att:
// per batch b, one strided-batched cuBLAS GEMM over the NH heads reads Q, K and V in place
// (leading dimension 3C, head stride HS). The causal mask is applied by the softmax kernel on
// full T x T scores (the GEMMs compute the masked half too: splitting the rows into causal
// blocks that skip it was measured slower on an H200, 60.5 against 43.7 ms per gpt2-124m step,
// since the smaller GEMMs ran far below the rate of the full ones; bench/RESULTS.md).
// Backward tells the paths apart by the number of saved tensors.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* attention_name = "attention";

// One warp per score row (rows of length T; the row's time index is row % T), so a row needs
// no block barriers and a block holds softmax_rows_per_block rows. Forward in two passes over
// the visible columns [0, n): an online max and rescaled sum, then p = exp(s - max) / sum;
// masked columns [n, T) get exactly 0.
constexpr int softmax_rows_per_block = 8;

__device__ inline int64_t softmax_first_row() {
  return int64_t(blockIdx.x) * softmax_rows_per_block + (threadIdx.x >> 5);
}
__device__ inline int64_t softmax_row_stride() { return int64_t(gridDim.x) * softmax_rows_per_block; }

__global__ void softmax_forward_kernel(float* att, int64_t rows, int64_t T, bool causal) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = softmax_first_row(); row < rows; row += softmax_row_stride()) {
    float* p = att + row * T;
    const int64_t n = causal ? row % T + 1 : T;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t j = lane; j < n; j += 32) {
      const float x = p[j];
      const float m = fmaxf(mx, x);
      sum = sum * expf(mx - m) + expf(x - m);  // expf(-inf) = 0 on a lane's first element
      mx = m;
    }
    // Combine the lanes: each lane's sum is relative to its own max.
    const float row_max = warp_max(mx);
    sum = warp_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - row_max));
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < T; j += 32) p[j] = j < n ? expf(p[j] - row_max) * inv : 0.0f;
  }
}

// In place on dS (which holds dP on entry): dS = P .* (dP - rowsum(P .* dP)) on the visible
// columns, 0 on the masked ones; one warp per row as above.
__global__ void softmax_backward_kernel(float* ds, const float* att, int64_t rows, int64_t T, bool causal) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = softmax_first_row(); row < rows; row += softmax_row_stride()) {
    const float* p = att + row * T;
    float* d = ds + row * T;
    const int64_t n = causal ? row % T + 1 : T;
    float dot = 0.0f;
    for (int64_t j = lane; j < n; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int64_t j = lane; j < T; j += 32) d[j] = j < n ? p[j] * (d[j] - dot) : 0.0f;
  }
}

unsigned softmax_grid(int64_t rows) {
  const int64_t blocks = (rows + softmax_rows_per_block - 1) / softmax_rows_per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

struct sizes {
  int t, hs, c, c3, nh;
};

sizes sizes_of(int64_t T, int64_t C, int64_t NH) {
  return {cpu::blas_int(T, attention_name), cpu::blas_int(C / NH, attention_name), cpu::blas_int(C, attention_name),
          cpu::blas_int(3 * C, attention_name), cpu::blas_int(NH, attention_name)};
}

}  // namespace

void attention_forward_cuda(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                            bool causal, const launch& l) {
  if (B == 0 || T == 0) return;
  const sizes z = sizes_of(T, C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(z.hs));
  const int64_t TT = T * T;
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * 3 * C;
    // S_h = scale Q_h K_h^T for every head h at once.
    gemm_batched(l, false, true, z.t, z.t, z.hs, scale, q, z.c3, z.hs, q + C, z.c3, z.hs, 0.0f, att + b * NH * TT,
                 z.t, TT, z.nh);
  }
  const int64_t rows = B * NH * T;
  softmax_forward_kernel<<<softmax_grid(rows), 32 * softmax_rows_per_block, 0, l.stream>>>(att, rows, T, causal);
  CUDA_CHECK_LAUNCH();
  for (int64_t b = 0; b < B; ++b) {
    const float* v = qkv + b * T * 3 * C + 2 * C;
    // O_h = P_h V_h, written to the head's columns of out.
    gemm_batched(l, false, false, z.t, z.hs, z.t, 1.0f, att + b * NH * TT, z.t, TT, v, z.c3, z.hs, 0.0f,
                 out + b * T * C, z.c, z.hs, z.nh);
  }
}

// `ds` is scratch of NH*T*T floats, reused for every batch (the stream orders the reuse).
void attention_backward_cuda(float* dqkv, float* ds, const float* dout, const float* qkv, const float* att, int64_t B,
                             int64_t T, int64_t C, int64_t NH, bool causal, const launch& l) {
  if (B == 0 || T == 0) return;
  const sizes z = sizes_of(T, C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(z.hs));
  const int64_t TT = T * T;
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * 3 * C;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* p = att + b * NH * TT;
    const float* dout_b = dout + b * T * C;
    float* dq = dqkv + b * T * 3 * C;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    // dP = dO V^T and dV += P^T dO.
    gemm_batched(l, false, true, z.t, z.t, z.hs, 1.0f, dout_b, z.c, z.hs, v, z.c3, z.hs, 0.0f, ds, z.t, TT, z.nh);
    gemm_batched(l, true, false, z.t, z.hs, z.t, 1.0f, p, z.t, TT, dout_b, z.c, z.hs, 1.0f, dv, z.c3, z.hs, z.nh);
    const int64_t rows = NH * T;
    softmax_backward_kernel<<<softmax_grid(rows), 32 * softmax_rows_per_block, 0, l.stream>>>(ds, p, rows, T, causal);
    CUDA_CHECK_LAUNCH();
    // S = scale Q K^T:  dQ += scale dS K,  dK += scale dS^T Q.
    gemm_batched(l, false, false, z.t, z.hs, z.t, scale, ds, z.t, TT, k, z.c3, z.hs, 1.0f, dq, z.c3, z.hs, z.nh);
    gemm_batched(l, true, false, z.t, z.hs, z.t, scale, ds, z.t, TT, q, z.c3, z.hs, 1.0f, dk, z.c3, z.hs, z.nh);
  }
}

namespace {

// The fused kernels unless the head size or the device rules them out, or the environment asks
// for the cuBLAS path (FUSION_CUDA_ATTENTION=gemm; read once per process).
bool use_flash(int64_t head_size, const launch& l) {
  static const bool gemm_asked = [] {
    const char* v = std::getenv("FUSION_CUDA_ATTENTION");
    return v != nullptr && std::strcmp(v, "gemm") == 0;
  }();
  return !gemm_asked && attention_flash_supported(head_size, l);
}

class attention_op final : public cuda_op {
 public:
  explicit attention_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(attention_name, attrs)),
        heads_(attrs.get_int("heads")),
        causal_(attrs.get_bool("causal", true)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(attention_name, a, 1, 0);
    const tensor& in = *a.inputs[0];
    check_device_f32(attention_name, "qkv", &in);
    const shape_t out = infer_from(a.inputs);
    const int64_t B = in.dim(0), T = in.dim(1), C = in.dim(2) / 3;
    check_f32_call(attention_name, a.output->type());
    check_device_f32(attention_name, "output", a.output);
    cpu::check_tensor_shape(attention_name, "output", a.output, out);
    const launch l = launch_of(a.ctx, attention_name);
    a.saved->clear();
    if (use_flash(C / heads_, l)) {
      a.saved->push_back(tensor::uninitialized({B, heads_, T}, dtype::f32, device_kind::cuda));
      a.saved->push_back(tensor::uninitialized(out, dtype::f32, device_kind::cuda));
      attention_flash_forward_cuda(a.output->f32(), (*a.saved)[0].f32(), in.f32(), B, T, C, heads_, causal_, l);
      // Backward needs the output; the actor hands a.output on, so it keeps its own copy.
      CUDA_CHECK(cudaMemcpyAsync((*a.saved)[1].f32(), a.output->f32(), a.output->numel() * sizeof(float),
                                 cudaMemcpyDeviceToDevice, l.stream));
      return;
    }
    a.saved->push_back(tensor::uninitialized({B, heads_, T, T}, dtype::f32, device_kind::cuda));
    attention_forward_cuda(a.output->f32(), (*a.saved)[0].f32(), in.f32(), B, T, C, heads_, causal_, l);
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(attention_name, a, 1, 0);
    const tensor& in = *a.inputs[0];
    check_device_f32(attention_name, "qkv", &in);
    const shape_t out = infer_from(a.inputs);
    const int64_t B = in.dim(0), T = in.dim(1), C = in.dim(2) / 3;
    check_device_f32(attention_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(attention_name, "output grad", a.output_grad, out);
    tensor* dqkv = a.input_grads[0];
    if (dqkv == nullptr) return;  // nothing upstream wants it
    check_device_f32(attention_name, "input grad", dqkv);
    cpu::check_tensor_shape(attention_name, "input grad", dqkv, in.shape());
    const launch l = launch_of(a.ctx, attention_name);
    if (a.saved != nullptr && a.saved->size() == 2) {
      check_device_f32_shape(attention_name, "saved row sums", &(*a.saved)[0], {B, heads_, T});
      check_device_f32_shape(attention_name, "saved output", &(*a.saved)[1], out);
      tensor dvec = tensor::uninitialized({B, heads_, T}, dtype::f32, device_kind::cuda);
      attention_flash_backward_cuda(dqkv->f32(), dvec.f32(), a.output_grad->f32(), in.f32(), (*a.saved)[1].f32(),
                                    (*a.saved)[0].f32(), B, T, C, heads_, causal_, l);
      return;
    }
    if (a.saved == nullptr || a.saved->size() != 1)
      throw op_error("attention: backward without the tensors saved by forward");
    check_device_f32(attention_name, "saved probabilities", &(*a.saved)[0]);
    cpu::check_tensor_shape(attention_name, "saved probabilities", &(*a.saved)[0], {B, heads_, T, T});
    // Freed (stream-ordered, tensor/device.hpp) after the kernels below have run.
    tensor ds = tensor::uninitialized({heads_, T, T}, dtype::f32, device_kind::cuda);
    attention_backward_cuda(dqkv->f32(), ds.f32(), a.output_grad->f32(), in.f32(), (*a.saved)[0].f32(), B, T, C,
                            heads_, causal_, l);
  }

 private:
  int64_t heads_;
  bool causal_;
};

}  // namespace

std::unique_ptr<op> make_attention_cuda(const attr_map& attrs) { return std::make_unique<attention_op>(attrs); }

}  // namespace fusion::cuda
