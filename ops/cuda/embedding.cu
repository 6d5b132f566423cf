// Token and position embeddings: CUDA kernels and ops (CPU twin: ops/cpu/embedding.cpp).
//
// Shape legend: N = B*T token positions, C channels, V vocabulary, L max_len.
//   token_embedding:    ids (B,T) i32, weight (V,C) -> out (B,T,C)
//   position_embedding: in (B,T,C), weight (L,C)    -> out (B,T,C) (rows 0..T-1 of weight)
//
// An out-of-range token id cannot throw from a kernel: its output row is written as zeros, its
// gradient is dropped, and the id is recorded in the context's error flag, which the backend
// reports as op_error at its next synchronize().
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

__global__ void token_embedding_forward_kernel(float* out, const int32_t* ids, const float* weight, int64_t N,
                                               int64_t C, int64_t V, int* flag) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i - n * C;
    const int32_t id = ids[n];
    if (id < 0 || id >= V) {
      if (c == 0) record_bad_id(flag, bad_token_id, n, id, V);
      out[i] = 0.0f;
    } else {
      out[i] = weight[id * C + c];
    }
  }
}

// Rows of the table are hit by every position holding that id: atomics, so the summation order
// (and the last bits of dweight) may differ from the CPU's position order.
__global__ void token_embedding_backward_kernel(float* dweight, const int32_t* ids, const float* dout, int64_t N,
                                                int64_t C, int64_t V, int* flag) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i - n * C;
    const int32_t id = ids[n];
    if (id < 0 || id >= V) {
      if (c == 0) record_bad_id(flag, bad_token_id, n, id, V);
      continue;
    }
    atomicAdd(dweight + id * C + c, dout[i]);
  }
}

// row = T*C: weight rows 0..T-1 are contiguous, so batch b adds the same block.
__global__ void position_embedding_forward_kernel(float* out, const float* in, const float* weight, int64_t total,
                                                  int64_t row) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = in[i] + weight[i % row];
}

}  // namespace

void token_embedding_forward_cuda(float* out, const int32_t* ids, const float* weight, int64_t N, int64_t C,
                                  int64_t V, const launch& l) {
  if (N * C == 0) return;
  token_embedding_forward_kernel<<<grid_for(N * C), block_threads, 0, l.stream>>>(out, ids, weight, N, C, V,
                                                                                 l.error_flag);
  CUDA_CHECK_LAUNCH();
}

void token_embedding_backward_cuda(float* dweight, const int32_t* ids, const float* dout, int64_t N, int64_t C,
                                   int64_t V, const launch& l) {
  if (N * C == 0) return;
  token_embedding_backward_kernel<<<grid_for(N * C), block_threads, 0, l.stream>>>(dweight, ids, dout, N, C, V,
                                                                                  l.error_flag);
  CUDA_CHECK_LAUNCH();
}

void position_embedding_forward_cuda(float* out, const float* in, const float* weight, int64_t B, int64_t T,
                                     int64_t C, const launch& l) {
  const int64_t total = B * T * C;
  if (total == 0) return;
  position_embedding_forward_kernel<<<grid_for(total), block_threads, 0, l.stream>>>(out, in, weight, total, T * C);
  CUDA_CHECK_LAUNCH();
}

void position_embedding_backward_cuda(float* din, float* dweight, const float* dout, int64_t B, int64_t T,
                                      int64_t C, const launch& l) {
  if (din) add_inplace_cuda(din, dout, B * T * C, l.stream);
  if (dweight) column_sum_accumulate_cuda(dweight, dout, B, T * C, l.stream);  // sum over b, fixed order
}

namespace {

constexpr const char* tok_name = "token_embedding";
constexpr const char* pos_name = "position_embedding";

class token_embedding_op final : public cuda_op {
 public:
  explicit token_embedding_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(tok_name, attrs)), vocab_(attrs.get_int("vocab")), dim_(attrs.get_int("dim")) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(tok_name, a, 1, 1);
    const tensor& ids = *a.inputs[0];
    check_device_i32(tok_name, "token ids", &ids);
    if (ids.rank() != 2) throw op_error(std::string(tok_name) + ": token ids must be (B, T), got " + to_string(ids.shape()));
    check_f32_call(tok_name, a.output->type());
    check_device_f32(tok_name, "param weight", a.params[0]);
    check_device_f32(tok_name, "output", a.output);
    cpu::check_tensor_shape(tok_name, "param weight", a.params[0], {vocab_, dim_});
    cpu::check_tensor_shape(tok_name, "output", a.output, {ids.dim(0), ids.dim(1), dim_});
    token_embedding_forward_cuda(a.output->f32(), ids.i32(), a.params[0]->f32(), ids.numel(), dim_, vocab_,
                                 launch_of(a.ctx, tok_name));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(tok_name, a, 1, 1);
    const tensor& ids = *a.inputs[0];
    check_device_i32(tok_name, "token ids", &ids);
    if (ids.rank() != 2) throw op_error(std::string(tok_name) + ": token ids must be (B, T), got " + to_string(ids.shape()));
    check_device_f32(tok_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(tok_name, "output grad", a.output_grad, {ids.dim(0), ids.dim(1), dim_});
    tensor* dw = a.param_grads[0];
    if (!dw) return;
    check_device_f32(tok_name, "weight grad", dw);
    cpu::check_tensor_shape(tok_name, "weight grad", dw, {vocab_, dim_});
    token_embedding_backward_cuda(dw->f32(), ids.i32(), a.output_grad->f32(), ids.numel(), dim_, vocab_,
                                  launch_of(a.ctx, tok_name));
  }

 private:
  int64_t vocab_;
  int64_t dim_;
};

class position_embedding_op final : public cuda_op {
 public:
  explicit position_embedding_op(const attr_map& attrs)
      : cuda_op(fusion::make_op(pos_name, attrs)), max_len_(attrs.get_int("max_len")) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(pos_name, a, 1, 1);
    const tensor& x = *a.inputs[0];
    check_device_f32(pos_name, "input", &x);
    const shape_t out = infer_from(a.inputs);
    check_f32_call(pos_name, a.output->type());
    check_device_f32(pos_name, "param weight", a.params[0]);
    check_device_f32(pos_name, "output", a.output);
    cpu::check_tensor_shape(pos_name, "param weight", a.params[0], {max_len_, x.dim(2)});
    cpu::check_tensor_shape(pos_name, "output", a.output, out);
    position_embedding_forward_cuda(a.output->f32(), x.f32(), a.params[0]->f32(), x.dim(0), x.dim(1), x.dim(2),
                                    launch_of(a.ctx, pos_name));
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(pos_name, a, 1, 1);
    const tensor& x = *a.inputs[0];
    check_device_f32(pos_name, "input", &x);
    infer_from(a.inputs);
    check_device_f32(pos_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(pos_name, "output grad", a.output_grad, x.shape());
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    if (dx) check_device_f32_shape(pos_name, "input grad", dx, x.shape());
    if (dw) {
      check_device_f32(pos_name, "weight grad", dw);
      cpu::check_tensor_shape(pos_name, "weight grad", dw, {max_len_, x.dim(2)});
    }
    position_embedding_backward_cuda(dx ? dx->f32() : nullptr, dw ? dw->f32() : nullptr, a.output_grad->f32(),
                                     x.dim(0), x.dim(1), x.dim(2), launch_of(a.ctx, pos_name));
  }

 private:
  int64_t max_len_;
};

}  // namespace

std::unique_ptr<op> make_token_embedding_cuda(const attr_map& attrs) {
  return std::make_unique<token_embedding_op>(attrs);
}

std::unique_ptr<op> make_position_embedding_cuda(const attr_map& attrs) {
  return std::make_unique<position_embedding_op>(attrs);
}

}  // namespace fusion::cuda
