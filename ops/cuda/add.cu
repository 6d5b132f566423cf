// Residual add (no broadcasting) and identity: CUDA kernels and ops (CPU twin: ops/cpu/add.cpp).
//
// Shape legend: n elements; a, b, out (and their gradients) share one shape.
// Backward is dst += dout for each input gradient, the same kernel the backend uses for
// gradient fan-in sums (add_inplace_cuda, ops/cuda/common.cu).
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

__global__ void add_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

}  // namespace

void add_forward_cuda(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_forward_kernel<<<grid_for(n), block_threads, 0, s>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

void add_backward_cuda(float* din, const float* dout, int64_t n, cudaStream_t s) { add_inplace_cuda(din, dout, n, s); }

namespace {

constexpr const char* add_name = "add";

class add_op final : public cuda_op {
 public:
  explicit add_op(const attr_map& attrs) : cuda_op(fusion::make_op(add_name, attrs)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(add_name, a, 2, 0);
    check_device_f32(add_name, "input 0", a.inputs[0]);
    check_device_f32(add_name, "input 1", a.inputs[1]);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(add_name, a.output->type());
    check_device_f32(add_name, "output", a.output);
    cpu::check_tensor_shape(add_name, "output", a.output, out);
    add_forward_cuda(a.output->f32(), a.inputs[0]->f32(), a.inputs[1]->f32(), a.output->numel(),
                     launch_of(a.ctx, add_name).stream);
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(add_name, a, 2, 0);
    check_device_f32(add_name, "output grad", a.output_grad);
    const shape_t& s = a.output_grad->shape();  // the inputs' shape (their values are freed)
    const cudaStream_t stream = launch_of(a.ctx, add_name).stream;
    for (size_t i = 0; i < 2; ++i) {
      tensor* d = a.input_grads[i];
      if (!d) continue;
      const char* what = i == 0 ? "input 0 grad" : "input 1 grad";
      check_device_f32(add_name, what, d);
      cpu::check_tensor_shape(add_name, what, d, s);
      add_backward_cuda(d->f32(), a.output_grad->f32(), a.output_grad->numel(), stream);
    }
  }
};

constexpr const char* identity_name = "identity";

class identity_op final : public cuda_op {
 public:
  explicit identity_op(const attr_map& attrs) : cuda_op(fusion::make_op(identity_name, attrs)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(identity_name, a, 1, 0);
    check_device_f32(identity_name, "input 0", a.inputs[0]);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(identity_name, a.output->type());
    check_device_f32(identity_name, "output", a.output);
    cpu::check_tensor_shape(identity_name, "output", a.output, out);
    if (a.output->numel() == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(a.output->f32(), a.inputs[0]->f32(), a.output->numel() * sizeof(float),
                               cudaMemcpyDeviceToDevice, launch_of(a.ctx, identity_name).stream));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(identity_name, a, 1, 0);
    check_device_f32(identity_name, "output grad", a.output_grad);
    const shape_t& s = a.output_grad->shape();  // the input's shape (its values are freed)
    tensor* d = a.input_grads[0];
    if (!d) return;
    check_device_f32(identity_name, "input 0 grad", d);
    cpu::check_tensor_shape(identity_name, "input 0 grad", d, s);
    add_backward_cuda(d->f32(), a.output_grad->f32(), a.output_grad->numel(), launch_of(a.ctx, identity_name).stream);
  }
};

}  // namespace

std::unique_ptr<op> make_add_cuda(const attr_map& attrs) { return std::make_unique<add_op>(attrs); }
std::unique_ptr<op> make_identity_cuda(const attr_map& attrs) { return std::make_unique<identity_op>(attrs); }

}  // namespace fusion::cuda
