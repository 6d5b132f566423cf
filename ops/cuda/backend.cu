// The CUDA backend (ops/backend.hpp): one cuBLAS handle and a little scratch per op actor on
// the device's shared stream, timing events, the CUDA op table (from ops/op_kinds.hpp),
// transfers with pinned host staging, and the optimizer entry points.
//
// Shape legend: n elements of a tensor.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace fusion::cuda {

namespace {

// ---- op table -------------------------------------------------------------------------------

using factory = std::unique_ptr<op> (*)(const attr_map&);

struct op_entry {
  const char* kind;
  factory make;
};

// Every kind of ops/op_kinds.hpp: a kind without make_<kind>_cuda fails to link.
#define FUSION_CUDA_ENTRY(kind, family, ...) {#kind, make_##kind##_cuda},
constexpr op_entry op_table[] = {FUSION_OP_KINDS(FUSION_CUDA_ENTRY)};
#undef FUSION_CUDA_ENTRY

// The one stream of each device, shared by every backend of the process on it and never
// destroyed (like the per-thread cuBLAS handles of common.cu: tearing it down at exit can run
// after the runtime has shut down). One stream orders the actors' kernels as their messages
// order them, so an actor hands a device tensor on without waiting for it on the host, and the
// GPU runs the next op's kernels as soon as they are queued. A blocking stream (not
// cudaStreamNonBlocking): tensor allocations and frees on the legacy stream stay ordered with it
// (ops/cuda/device.cu).
cudaStream_t device_stream(int index) {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard lock(mutex);
  cudaStream_t& s = streams[index];
  if (s == nullptr) CUDA_CHECK(cudaStreamCreate(&s));
  return s;
}

void check_pair(const char* who, const tensor& a, const tensor& b) {
  check_device_f32(who, "tensor", &a);
  check_device_f32(who, "tensor", &b);
  if (a.shape() != b.shape())
    throw op_error(std::string(who) + ": shapes differ: " + to_string(a.shape()) + " vs " + to_string(b.shape()));
}

class cuda_backend final : public backend {
 public:
  cuda_backend(int index, gemm_precision gemm) : index_(index) {
    const int n = device_count();
    if (index < 0 || index >= n)
      throw std::runtime_error("cuda:" + std::to_string(index) + " requested but " +
                               (n == 0 ? std::string("no CUDA device is available (no GPU or no driver)")
                                       : std::to_string(n) + " CUDA device(s) exist"));
    try {
      CUDA_CHECK(cudaSetDevice(index_));
      cudaDeviceProp prop{};
      CUDA_CHECK(cudaGetDeviceProperties(&prop, index_));
      name_ = "cuda:" + std::to_string(index_) + " (" + prop.name + ")";
      stream_ = device_stream(index_);
      CUBLAS_CHECK(cublasCreate(&blas_));
      CUBLAS_CHECK(cublasSetStream(blas_, stream_));
      CUDA_CHECK(cudaMalloc(&flag_, 4 * sizeof(int)));
      CUDA_CHECK(cudaMemset(flag_, 0, 4 * sizeof(int)));
      CUDA_CHECK(cudaMalloc(&reduce_, (sum_squares_max_parts + 1) * sizeof(double)));
      CUDA_CHECK(cudaMallocHost(&host_, host_bytes));
    } catch (...) {
      release();
      throw;
    }
    ctx_.device = device_kind::cuda;
    ctx_.device_index = index_;
    ctx_.stream = stream_;
    ctx_.blas = blas_;
    ctx_.error_flag = flag_;
    ctx_.gemm = gemm;
  }

  ~cuda_backend() override { release(); }
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  device_kind kind() const override { return device_kind::cuda; }
  std::string name() const override { return name_; }

  std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) const override {
    return cuda::make_op(kind, attrs);
  }

  tensor empty(shape_t shape, dtype t) override {
    activate();
    return tensor::uninitialized(std::move(shape), t, device_kind::cuda);
  }

  tensor zeros(shape_t shape, dtype t) override {
    activate();
    return tensor(std::move(shape), t, device_kind::cuda);
  }

  tensor upload(tensor t) override {
    if (t.is_cuda() || t.empty()) return t;
    activate();
    tensor out = tensor::uninitialized(t.shape(), t.type(), device_kind::cuda);
    // From pageable memory the runtime stages through its own pinned buffers and returns once
    // `t` may be freed; the copy is ordered on this stream before any kernel that reads `out`.
    if (t.nbytes())
      CUDA_CHECK(cudaMemcpyAsync(out.bytes(), t.bytes(), t.nbytes(), cudaMemcpyHostToDevice, stream_));
    return out;
  }

  tensor download(const tensor& t) override {
    if (!t.is_cuda() || t.empty()) return t;
    activate();
    tensor out = tensor::uninitialized(t.shape(), t.type());
    // Through the pinned staging buffer, in chunks: full-speed DMA without pinning `out`.
    size_t done = 0;
    while (done < t.nbytes()) {
      const size_t chunk = std::min(host_bytes, t.nbytes() - done);
      CUDA_CHECK(cudaMemcpyAsync(host_, t.bytes() + done, chunk, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      std::memcpy(out.bytes() + done, host_, chunk);
      done += chunk;
    }
    synchronize();
    return out;
  }

  void add_inplace(tensor& dst, const tensor& src) override {
    check_pair("cuda backend add_inplace", dst, src);
    activate();
    add_inplace_cuda(dst.f32(), src.f32(), dst.numel(), stream_);
  }

  double sum_of_squares(const tensor& t) override {
    check_device_f32("cuda backend sum_of_squares", "tensor", &t);
    activate();
    double* out = reduce_ + sum_squares_max_parts;
    sum_of_squares_cuda(out, reduce_, t.f32(), t.numel(), stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_, out, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    double result = 0;
    std::memcpy(&result, host_, sizeof(double));
    return result;
  }

  void adamw_update(tensor& p, const tensor& g, tensor& m, tensor& v, int64_t t, double lr, const optim_config& c,
                    bool decay, float grad_scale) override {
    check_pair("cuda backend adamw_update", p, g);
    check_pair("cuda backend adamw_update", p, m);
    check_pair("cuda backend adamw_update", p, v);
    activate();
    adamw_update_cuda(p.f32(), g.f32(), m.f32(), v.f32(), p.numel(), t, lr, c, decay, grad_scale, stream_);
  }

  void sgd_update(tensor& p, const tensor& g, tensor& buf, double lr, const optim_config& c, bool decay,
                  float grad_scale) override {
    check_pair("cuda backend sgd_update", p, g);
    check_pair("cuda backend sgd_update", p, buf);
    activate();
    sgd_update_cuda(p.f32(), g.f32(), buf.f32(), p.numel(), lr, c, decay, grad_scale, stream_);
  }

  void synchronize() override {
    activate();
    int flag[4] = {0, 0, 0, 0};
    CUDA_CHECK(cudaMemcpyAsync(host_, flag_, sizeof flag, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(flag, host_, sizeof flag);
    if (flag[0] == 0) return;
    CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof flag, stream_));
    const std::string what = flag[0] == bad_token_id ? "token_embedding: token id " : "cross_entropy: target id ";
    throw op_error(what + std::to_string(flag[2]) + " at position " + std::to_string(flag[1]) +
                   " is out of range [0, " + std::to_string(flag[3]) + ") (found on " + name_ + ")");
  }

  const exec_context* context() const override { return &ctx_; }

  void begin_timing(size_t slot) override { record(begin_, slot); }
  void end_timing(size_t slot) override { record(end_, slot); }

  double timed_seconds(size_t slot) override {
    if (slot >= begin_.size() || slot >= end_.size() || !begin_[slot] || !end_[slot]) return 0.0;
    activate();
    CUDA_CHECK(cudaEventSynchronize(end_[slot]));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, begin_[slot], end_[slot]));
    return ms * 1e-3;
  }

 private:
  void record(std::vector<cudaEvent_t>& events, size_t slot) {
    activate();
    if (slot >= events.size()) events.resize(slot + 1, nullptr);
    if (events[slot] == nullptr) CUDA_CHECK(cudaEventCreate(&events[slot]));
    CUDA_CHECK(cudaEventRecord(events[slot], stream_));
  }

  static constexpr size_t host_bytes = size_t(8) << 20;  // pinned staging for downloads

  void activate() const { CUDA_CHECK(cudaSetDevice(index_)); }

  // Errors are ignored: nothing useful can be done about them during teardown.
  void release() noexcept {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (auto* events : {&begin_, &end_})
      for (cudaEvent_t e : *events)
        if (e) (void)cudaEventDestroy(e);
    begin_.clear(), end_.clear();
    if (blas_) (void)cublasDestroy(blas_);
    if (flag_) (void)cudaFree(flag_);
    if (reduce_) (void)cudaFree(reduce_);
    if (host_) (void)cudaFreeHost(host_);
    blas_ = nullptr, stream_ = nullptr, flag_ = nullptr, reduce_ = nullptr, host_ = nullptr;
    (void)cudaGetLastError();
  }

  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;  ///< the device's shared stream (device_stream), not owned
  cublasHandle_t blas_ = nullptr;
  std::vector<cudaEvent_t> begin_, end_;  ///< timing slots, created on first use
  int* flag_ = nullptr;        ///< device int[4], see exec_context::error_flag
  double* reduce_ = nullptr;   ///< device: sum_squares_max_parts partials + the result
  void* host_ = nullptr;       ///< pinned, host_bytes
  exec_context ctx_;
};

}  // namespace

std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) {
  for (const op_entry& e : op_table)
    if (kind == e.kind) return e.make(attrs);
  // Both tables come from ops/op_kinds.hpp, so the kind is unknown to the CPU registry too,
  // whose error lists the known kinds.
  fusion::make_op(kind, attrs);
  throw op_error("unknown op '" + kind + "'");
}

std::unique_ptr<backend> make_backend(int index, gemm_precision gemm) {
  return std::make_unique<cuda_backend>(index, gemm);
}

}  // namespace fusion::cuda
