// Softmax cross-entropy loss: CUDA kernels and op (CPU twin: ops/cpu/cross_entropy.cpp).
//
// Shape legend: rows = B*T positions, V vocabulary.
//   logits (B, T, V) f32, targets (B, T) i32 -> loss () = mean over rows of
//   logsumexp(logits[r]) - logits[r, target[r]]; saved row max (B, T) and row log-sum (B, T).
// Forward: one block per row (max, then sum of exp(x - max): stable for any logit magnitude),
// then one block sums the row losses in double in a fixed order and writes the mean. The loss
// stays in device memory; backward reads the scalar output gradient from device memory too, so
// nothing synchronises with the host. An out-of-range target is recorded in the context's
// error flag (reported by backend::synchronize()) and its row contributes nothing.
// Metric "accuracy" (only when forward_args::metrics is set): one block per row finds the FIRST
// index of the row's maximum logit (a loop `if (x[j] > x[best]) best = j` from best = 0, so NaN
// logits never win unless the first one is NaN), an integer counter sums the rows predicted
// right, and the count is downloaded: the metric path synchronises the stream.
#include <string>

#include "ops/cuda/common.cuh"

namespace fusion::cuda {

namespace {

constexpr const char* cross_entropy_name = "cross_entropy";

__global__ void cross_entropy_rows_kernel(float* row_loss, float* max, float* logsum, const float* logits,
                                          const int32_t* targets, int64_t rows, int64_t V, int* flag) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = logits + r * V;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx, shared);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - mx);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
      const float ls = logf(s);
      const int32_t id = targets[r];
      max[r] = mx;
      logsum[r] = ls;
      if (id < 0 || id >= V) {
        record_bad_id(flag, bad_target_id, r, id, V);
        row_loss[r] = 0.0f;
      } else {
        row_loss[r] = ls + (mx - x[id]);
      }
    }
  }
}

// One block: the mean of the row losses, summed in double like the CPU's total.
__global__ void mean_kernel(float* loss, const float* row_loss, int64_t rows) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += static_cast<double>(row_loss[r]);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(s / static_cast<double>(rows));
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* dloss, const float* logits,
                                              const int32_t* targets, const float* max, const float* logsum,
                                              int64_t rows, int64_t V, int* flag) {
  const float g = dloss[0] / static_cast<float>(rows);
  const int64_t total = rows * V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / V, j = i - r * V;
    const int32_t id = targets[r];
    if (id < 0 || id >= V) {
      if (j == 0) record_bad_id(flag, bad_target_id, r, id, V);
      continue;
    }
    // Two separate updates, like the CPU: += g * softmax, then -= g at the target.
    float d = dlogits[i] + g * expf((logits[i] - max[r]) - logsum[r]);
    if (j == id) d -= g;
    dlogits[i] = d;
  }
}

// Whether (v, i) comes before (w, j) in the argmax order: larger value first, then smaller
// index; index `none` (no number seen) comes last.
__device__ inline bool argmax_before(float v, int64_t i, float w, int64_t j, int64_t none) {
  if (i == none) return false;
  return j == none || v > w || (v == w && i < j);
}

// correct[0] += 1 for every row whose first maximal logit is its target.
__global__ void accuracy_kernel(int* correct, const float* logits, const int32_t* targets, int64_t rows,
                                int64_t V) {
  __shared__ float best_v[32];
  __shared__ int64_t best_i[32];
  const int64_t none = V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = logits + r * V;
    float v = -INFINITY;
    int64_t i = none;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)  // increasing j: ties keep the first
      if (!isnan(x[j]) && argmax_before(x[j], j, v, i, none)) v = x[j], i = j;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (argmax_before(ov, oi, v, i, none)) v = ov, i = oi;
    }
    __syncthreads();  // the previous row may still be reading the slots
    if (lane == 0) best_v[warp] = v, best_i[warp] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nwarps; ++w)
        if (argmax_before(best_v[w], best_i[w], v, i, none)) v = best_v[w], i = best_i[w];
      // A NaN first logit is never replaced by the sequential rule; nor is index 0 when no
      // logit is a number.
      const int64_t pred = (isnan(x[0]) || i == none) ? 0 : i;
      if (pred == targets[r]) atomicAdd(correct, 1);
    }
  }
}

}  // namespace

/// Number of rows whose first maximal logit equals the target (waits for the stream).
int64_t cross_entropy_correct_cuda(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                                   const launch& l) {
  tensor counter = tensor::uninitialized({1}, dtype::i32, device_kind::cuda);
  CUDA_CHECK(cudaMemsetAsync(counter.i32(), 0, sizeof(int), l.stream));
  accuracy_kernel<<<rows_grid(rows), row_threads(V), 0, l.stream>>>(counter.i32(), logits, targets, rows, V);
  CUDA_CHECK_LAUNCH();
  int correct = 0;
  CUDA_CHECK(cudaMemcpyAsync(&correct, counter.i32(), sizeof(int), cudaMemcpyDeviceToHost, l.stream));
  CUDA_CHECK(cudaStreamSynchronize(l.stream));
  return correct;
}

// `row_loss` is scratch of `rows` floats.
void cross_entropy_forward_cuda(float* loss, float* max, float* logsum, float* row_loss, const float* logits,
                                const int32_t* targets, int64_t rows, int64_t V, const launch& l) {
  cross_entropy_rows_kernel<<<rows_grid(rows), row_threads(V), 0, l.stream>>>(row_loss, max, logsum, logits, targets,
                                                                              rows, V, l.error_flag);
  CUDA_CHECK_LAUNCH();
  mean_kernel<<<1, block_threads, 0, l.stream>>>(loss, row_loss, rows);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward_cuda(float* dlogits, const float* dloss, const float* logits, const int32_t* targets,
                                 const float* max, const float* logsum, int64_t rows, int64_t V, const launch& l) {
  cross_entropy_backward_kernel<<<grid_for(rows * V), block_threads, 0, l.stream>>>(dlogits, dloss, logits, targets,
                                                                                   max, logsum, rows, V, l.error_flag);
  CUDA_CHECK_LAUNCH();
}

namespace {

class cross_entropy_op final : public cuda_op {
 public:
  explicit cross_entropy_op(const attr_map& attrs) : cuda_op(fusion::make_op(cross_entropy_name, attrs)) {}

  void forward(const forward_args& a) const override {
    cpu::check_forward_call(cross_entropy_name, a, 2, 0);
    check_device_f32(cross_entropy_name, "logits", a.inputs[0]);
    check_device_i32(cross_entropy_name, "targets", a.inputs[1]);
    infer_from(a.inputs);
    check_f32_call(cross_entropy_name, a.output->type());
    check_device_f32(cross_entropy_name, "output", a.output);
    cpu::check_tensor_shape(cross_entropy_name, "output", a.output, {});
    const int64_t rows = a.inputs[1]->numel(), V = a.inputs[0]->dim(-1);
    const shape_t row_shape = a.inputs[1]->shape();
    const launch l = launch_of(a.ctx, cross_entropy_name);
    tensor max = tensor::uninitialized(row_shape, dtype::f32, device_kind::cuda);
    tensor logsum = tensor::uninitialized(row_shape, dtype::f32, device_kind::cuda);
    tensor row_loss = tensor::uninitialized(row_shape, dtype::f32, device_kind::cuda);  // freed stream-ordered
    cross_entropy_forward_cuda(a.output->f32(), max.f32(), logsum.f32(), row_loss.f32(), a.inputs[0]->f32(),
                               a.inputs[1]->i32(), rows, V, l);
    a.saved->clear();
    a.saved->push_back(std::move(max));
    a.saved->push_back(std::move(logsum));
    if (a.metrics == nullptr) return;
    for (const std::string& m : metric_names()) {
      if (m != "accuracy") throw op_error("cross_entropy: no CUDA kernel for metric '" + m + "'");
      const int64_t correct = cross_entropy_correct_cuda(a.inputs[0]->f32(), a.inputs[1]->i32(), rows, V, l);
      a.metrics->push_back({static_cast<double>(correct), static_cast<double>(rows)});
    }
  }

  void backward(const backward_args& a) const override {
    cpu::check_backward_call(cross_entropy_name, a, 2, 0);
    check_device_f32(cross_entropy_name, "logits", a.inputs[0]);
    check_device_i32(cross_entropy_name, "targets", a.inputs[1]);
    infer_from(a.inputs);
    check_device_f32(cross_entropy_name, "output grad", a.output_grad);
    cpu::check_tensor_shape(cross_entropy_name, "output grad", a.output_grad, {});
    tensor* dlogits = a.input_grads[0];
    if (dlogits == nullptr) return;  // nothing upstream wants it
    check_device_f32(cross_entropy_name, "input grad", dlogits);
    cpu::check_tensor_shape(cross_entropy_name, "input grad", dlogits, a.inputs[0]->shape());
    const int64_t rows = a.inputs[1]->numel(), V = a.inputs[0]->dim(-1);
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != rows || (*a.saved)[1].numel() != rows)
      throw op_error("cross_entropy: backward without the row max and log-sum saved by forward");
    check_device_f32(cross_entropy_name, "saved row max", &(*a.saved)[0]);
    check_device_f32(cross_entropy_name, "saved row log-sum", &(*a.saved)[1]);
    cross_entropy_backward_cuda(dlogits->f32(), a.output_grad->f32(), a.inputs[0]->f32(), a.inputs[1]->i32(),
                                (*a.saved)[0].f32(), (*a.saved)[1].f32(), rows, V, launch_of(a.ctx, cross_entropy_name));
  }
};

}  // namespace

std::unique_ptr<op> make_cross_entropy_cuda(const attr_map& attrs) { return std::make_unique<cross_entropy_op>(attrs); }

}  // namespace fusion::cuda
