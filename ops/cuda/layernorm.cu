// Layer normalisation over the last dimension: CUDA kernels and op (CPU twin: ops/cpu/layernorm.cpp).
//
// Shape legend: rows = product of the leading dims, C channels (the normalised dimension).
//   in (..., C), weight (C), bias (C) -> out (..., C); saved mean (...), rstd (...)
// Forward: one block per row, two passes (mean, then centred variance) in fp32 like the CPU,
// rstd = 1 / sqrt(var + eps). Backward: one block per row for din, and a deterministic
// two-stage column reduction over rows for dweight and dbias (common.cuh column_split).
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* layernorm_name = "layernorm";

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* in, const float* w,
                                         const float* b, int64_t rows, int64_t C, float eps) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = in + r * C;
    float* y = out + r * C;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += x[i];
    const float m = block_sum(s, shared) / static_cast<float>(C);
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) v += (x[i] - m) * (x[i] - m);
    const float var = block_sum(v, shared) / static_cast<float>(C);
    const float rs = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) y[i] = (x[i] - m) * rs * w[i] + b[i];
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

__global__ void layernorm_backward_input_kernel(float* din, const float* dout, const float* in, const float* w,
                                                const float* mean, const float* rstd, int64_t rows, int64_t C) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = in + r * C;
    const float* dy = dout + r * C;
    float* dx = din + r * C;
    const float m = mean[r], s = rstd[r];
    float a = 0.0f, b = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      a += w[i] * dy[i];
      b += w[i] * dy[i] * (x[i] - m);
    }
    // The two projection terms of d(norm)/d(in), as in the CPU kernel.
    const float g_mean = block_sum(a, shared) / static_cast<float>(C);
    const float g_norm_mean = block_sum(b, shared) * s / static_cast<float>(C);
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
      dx[i] += (w[i] * dy[i] - g_mean - (x[i] - m) * s * g_norm_mean) * s;
  }
}

// Partial sums of dw[j] = sum_r (x[r,j] - mean[r]) * rstd[r] * dy[r,j] and db[j] = sum_r dy[r,j]
// over one chunk of rows (the first stage of a column reduction, common.cuh column_split):
// parts[0][chunk][j] and parts[1][chunk][j], lanes summed in a fixed order (deterministic).
__global__ void layernorm_backward_params_kernel(float* parts, const float* dout, const float* in, const float* mean,
                                                 const float* rstd, int64_t rows, int64_t C, int64_t per) {
  __shared__ float part_w[column_lanes][column_tile + 1];
  __shared__ float part_b[column_lanes][column_tile + 1];
  const int64_t col = int64_t(blockIdx.x) * column_tile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (col < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += column_lanes) {
      const float dy = dout[r * C + col];
      acc_w += (in[r * C + col] - mean[r]) * rstd[r] * dy;
      acc_b += dy;
    }
  part_w[threadIdx.y][threadIdx.x] = acc_w;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float sw = 0.0f, sb = 0.0f;
    for (int y = 0; y < column_lanes; ++y) sw += part_w[y][threadIdx.x], sb += part_b[y][threadIdx.x];
    const int64_t chunks = gridDim.y;
    parts[int64_t(blockIdx.y) * C + col] = sw;
    parts[(chunks + blockIdx.y) * C + col] = sb;
  }
}

}  // namespace

void layernorm_forward_cuda(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                            int64_t rows, int64_t C, float eps, cudaStream_t s) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<rows_grid(rows), row_threads(C), 0, s>>>(out, mean, rstd, in, w, b, rows, C, eps);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward_cuda(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                             const float* mean, const float* rstd, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  if (din) {
    layernorm_backward_input_kernel<<<rows_grid(rows), row_threads(C), 0, s>>>(din, dout, in, w, mean, rstd, rows, C);
    CUDA_CHECK_LAUNCH();
  }
  if (dw || db) {
    const column_split z = column_split_for(rows, C);
    // Freed stream-ordered (ops/cuda/device.cu) after the kernels below.
    tensor parts = tensor::uninitialized({2, z.chunks, C}, dtype::f32, device_kind::cuda);
    const dim3 grid(static_cast<unsigned>((C + column_tile - 1) / column_tile), static_cast<unsigned>(z.chunks));
    layernorm_backward_params_kernel<<<grid, dim3(column_tile, column_lanes), 0, s>>>(parts.f32(), dout, in, mean,
                                                                                       rstd, rows, C, z.rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    if (dw) column_parts_accumulate_cuda(dw, parts.f32(), z.chunks, C, s);
    if (db) column_parts_accumulate_cuda(db, parts.f32() + z.chunks * C, z.chunks, C, s);
  }
}

namespace {

class layernorm_op final : public cuda_op {
 public:
  explicit layernorm_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(layernorm_name, attrs)), eps_(attrs.get_float("eps", 1e-5)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(layernorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_device_f32(layernorm_name, "input", &in);
    infer_from(a.inputs);
    const shape_t c_shape{in.dim(-1)};
    check_f32_call(layernorm_name, a.output->type());
    check_device_f32(layernorm_name, "param weight", a.params[0]);
    check_device_f32(layernorm_name, "param bias", a.params[1]);
    check_device_f32(layernorm_name, "output", a.output);
    cpu::check_tensor_shape(layernorm_name, "param weight", a.params[0], c_shape);
    cpu::check_tensor_shape(layernorm_name, "param bias", a.params[1], c_shape);
    cpu::check_tensor_shape(layernorm_name, "output", a.output, in.shape());
    const int64_t C = in.dim(-1), rows = cpu::leading_rows(in.shape());
    const shape_t stat_shape(in.shape().begin(), in.shape().end() - 1);
    const launch l = launch_of(a.ctx, layernorm_name);
    a.saved->clear();
    a.saved->push_back(tensor::uninitialized(stat_shape, dtype::f32, device_kind::cuda));  // mean
    a.saved->push_back(tensor::uninitialized(stat_shape, dtype::f32, device_kind::cuda));  // rstd
    layernorm_forward_cuda(a.output->f32(), (*a.saved)[0].f32(), (*a.saved)[1].f32(), in.f32(), a.params[0]->f32(),
                           a.params[1]->f32(), rows, C, static_cast<float>(eps_), l.stream);
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(layernorm_name, a, 1, 2);
    const tensor& in = *a.inputs[0];
    check_device_f32(layernorm_name, "input", &in);
    infer_from(a.inputs);
    const shape_t c_shape{in.dim(-1)};
    check_device_f32(layernorm_name, "param weight", a.params[0]);
    cpu::check_tensor_shape(layernorm_name, "param weight", a.params[0], c_shape);
    check_device_f32(layernorm_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(layernorm_name, "output grad", a.output_grad, in.shape());
    tensor* din = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    tensor* db = a.param_grads[1];
    if (din) check_grad(din, "input grad", in.shape());
    if (dw) check_grad(dw, "weight grad", c_shape);
    if (db) check_grad(db, "bias grad", c_shape);
    const int64_t C = in.dim(-1), rows = cpu::leading_rows(in.shape());
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != rows || (*a.saved)[1].numel() != rows)
      throw op_error("layernorm: backward without the mean/rstd saved by forward");
    check_device_f32(layernorm_name, "saved mean", &(*a.saved)[0]);
    check_device_f32(layernorm_name, "saved rstd", &(*a.saved)[1]);
    layernorm_backward_cuda(din ? din->f32() : nullptr, dw ? dw->f32() : nullptr, db ? db->f32() : nullptr,
                            a.output_grad->f32(), in.f32(), a.params[0]->f32(), (*a.saved)[0].f32(),
                            (*a.saved)[1].f32(), rows, C, launch_of(a.ctx, layernorm_name).stream);
  }

 private:
  static void check_grad(const tensor* g, const char* what, const shape_t& want) {
    check_device_f32(layernorm_name, what, g);
    cpu::check_tensor_shape(layernorm_name, what, g, want);
  }

  double eps_;
};

}  // namespace

std::unique_ptr<op> make_layernorm_cuda(const attr_map& attrs) { return std::make_unique<layernorm_op>(attrs); }

}  // namespace fusion::cuda
