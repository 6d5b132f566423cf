// Elementwise activations (GELU tanh approximation, ReLU): CUDA kernels and ops
// (CPU twin: ops/cpu/activation.cpp).
//
// Shape legend: n elements of any shape; in, out, dout, din all have n elements.
// The float CPU kernel uses a rational tanh approximation (abs error ~2e-7); the GPU uses tanhf
// (max 2 ulp), so the two agree to ~1e-6 relative.
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr float gelu_k0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float gelu_k1 = 0.044715f;

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = in[i];
    const float t = tanhf(gelu_k0 * x * (1.0f + gelu_k1 * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

__global__ void gelu_backward_kernel(float* din, const float* in, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = in[i];
    const float x2 = x * x;
    const float t = tanhf(gelu_k0 * x * (1.0f + gelu_k1 * x2));
    // d tanh(u)/du = 1 - tanh^2: no cosh, so no overflow for large |u|.
    const float sech2 = 1.0f - t * t;
    const float grad = 0.5f * (1.0f + t) + 0.5f * gelu_k0 * x * sech2 * (1.0f + 3.0f * gelu_k1 * x2);
    din[i] += grad * dout[i];
  }
}

__global__ void relu_forward_kernel(float* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

__global__ void relu_backward_kernel(float* din, const float* in, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    din[i] += in[i] > 0.0f ? dout[i] : 0.0f;
}

}  // namespace

void gelu_forward_cuda(float* out, const float* in, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), block_threads, 0, s>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(float* din, const float* in, const float* dout, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), block_threads, 0, s>>>(din, in, dout, n);
  CUDA_CHECK_LAUNCH();
}

void relu_forward_cuda(float* out, const float* in, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  relu_forward_kernel<<<grid_for(n), block_threads, 0, s>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

void relu_backward_cuda(float* din, const float* in, const float* dout, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  relu_backward_kernel<<<grid_for(n), block_threads, 0, s>>>(din, in, dout, n);
  CUDA_CHECK_LAUNCH();
}

namespace {

struct gelu_kernels {
  static constexpr const char* name = "gelu";
  static void forward(float* out, const float* in, int64_t n, cudaStream_t s) { gelu_forward_cuda(out, in, n, s); }
  static void backward(float* din, const float* in, const float* dout, int64_t n, cudaStream_t s) {
    gelu_backward_cuda(din, in, dout, n, s);
  }
};

struct relu_kernels {
  static constexpr const char* name = "relu";
  static void forward(float* out, const float* in, int64_t n, cudaStream_t s) { relu_forward_cuda(out, in, n, s); }
  static void backward(float* din, const float* in, const float* dout, int64_t n, cudaStream_t s) {
    relu_backward_cuda(din, in, dout, n, s);
  }
};

/// One-input, parameter-free elementwise op; `K` supplies the kernels.
template <class K>
class unary_op final : public cuda_op {
 public:
  explicit unary_op(const attr_map& attrs) : cuda_op(fusion::make_op(K::name, attrs)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(K::name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_device_f32(K::name, "input", &x);
    check_f32_call(K::name, a.output->type());
    check_device_f32(K::name, "output", a.output);
    cpu::check_tensor_shape(K::name, "output", a.output, x.shape());
    K::forward(a.output->f32(), x.f32(), x.numel(), launch_of(a.ctx, K::name).stream);
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(K::name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    tensor* dx = a.input_grads[0];
    if (!dx) return;
    check_device_f32(K::name, "input", &x);
    check_device_f32(K::name, "output grad", a.output_grad);
    check_device_f32(K::name, "input grad", dx);
    cpu::check_tensor_shape(K::name, "output grad", a.output_grad, x.shape());
    cpu::check_tensor_shape(K::name, "input grad", dx, x.shape());
    K::backward(dx->f32(), x.f32(), a.output_grad->f32(), x.numel(), launch_of(a.ctx, K::name).stream);
  }
};

}  // namespace

std::unique_ptr<op> make_gelu_cuda(const attr_map& attrs) { return std::make_unique<unary_op<gelu_kernels>>(attrs); }
std::unique_ptr<op> make_relu_cuda(const attr_map& attrs) { return std::make_unique<unary_op<relu_kernels>>(attrs); }

}  // namespace fusion::cuda
