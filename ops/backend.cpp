// The CPU backend and make_backend(). The CPU backend forwards to exactly the functions the op
// actor calls today (fusion::make_op, ops/optim.hpp), so adopting it is bit-identical.
#include "ops/backend.hpp"

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu_quota.hpp"

#if FUSION_HAVE_CUDA
#include "ops/cuda/cuda_backend.hpp"
#endif

namespace fusion {

namespace {

void check_same(const char* who, const tensor& a, const tensor& b) {
  if (a.shape() != b.shape() || a.type() != dtype::f32 || b.type() != dtype::f32)
    throw std::runtime_error(std::string("cpu backend ") + who + ": expects f32 tensors of one shape, got " +
                                to_string(a.type()) + " " + to_string(a.shape()) + " and " + to_string(b.type()) +
                                " " + to_string(b.shape()));
  if (a.is_cuda() || b.is_cuda())
    throw std::runtime_error(std::string("cpu backend ") + who + ": got a cuda tensor (upload it first)");
}

class cpu_backend final : public backend {
 public:
  device_kind kind() const override { return device_kind::cpu; }
  std::string name() const override { return "cpu"; }

  std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) const override {
    return fusion::make_op(kind, attrs);
  }

  tensor empty(shape_t shape, dtype t) override { return tensor::uninitialized(std::move(shape), t); }
  tensor zeros(shape_t shape, dtype t) override { return tensor(std::move(shape), t); }
  tensor upload(tensor t) override { return std::move(t).to_cpu(); }
  tensor download(const tensor& t) override { return t.to_cpu(); }

  void add_inplace(tensor& dst, const tensor& src) override {
    check_same("add_inplace", dst, src);
    float* d = dst.f32();
    const float* g = src.f32();
    for (int64_t k = 0; k < dst.numel(); ++k) d[k] += g[k];
  }

  double sum_of_squares(const tensor& t) override {
    if (t.is_cuda() || t.type() != dtype::f32)
      throw std::runtime_error("cpu backend sum_of_squares: expects a CPU f32 tensor");
    return fusion::sum_of_squares(t.f32(), t.numel());
  }

  void adamw_update(tensor& p, const tensor& g, tensor& m, tensor& v, int64_t t, double lr, const optim_config& c,
                    bool decay, float grad_scale) override {
    check_same("adamw_update", p, g);
    check_same("adamw_update", p, m);
    check_same("adamw_update", p, v);
    fusion::adamw_update(p.f32(), g.f32(), m.f32(), v.f32(), p.numel(), t, lr, c, decay, grad_scale);
  }

  void sgd_update(tensor& p, const tensor& g, tensor& buf, double lr, const optim_config& c, bool decay,
                  float grad_scale) override {
    check_same("sgd_update", p, g);
    check_same("sgd_update", p, buf);
    fusion::sgd_update(p.f32(), g.f32(), buf.f32(), p.numel(), lr, c, decay, grad_scale);
  }

  void synchronize() override {}
  const exec_context* context() const override { return nullptr; }

  void begin_timing(size_t slot) override { span(slot).begin = mark(); }
  void end_timing(size_t slot) override { span(slot).end = mark(); }
  // Wall time; under a cgroup CPU quota below one core the thread's CPU time, the op at full
  // speed (ops/cpu_quota.hpp says why).
  double timed_seconds(size_t slot) override {
    if (slot >= spans_.size()) return 0.0;
    const timing& t = spans_[slot];
    if (process_cpu_quota().binds()) return t.end.cpu - t.begin.cpu;
    return std::chrono::duration<double>(t.end.wall - t.begin.wall).count();
  }

 private:
  using clock = std::chrono::steady_clock;
  struct instant {
    clock::time_point wall;
    double cpu = 0;  // the calling thread's CPU seconds
  };
  struct timing {
    instant begin, end;
  };
  static instant mark() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return {clock::now(), static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9};
  }
  timing& span(size_t slot) {
    if (slot >= spans_.size()) spans_.resize(slot + 1);
    return spans_[slot];
  }
  std::vector<timing> spans_;
};

}  // namespace

bool cuda_compiled() noexcept { return FUSION_HAVE_CUDA != 0; }

void register_cuda_backend() noexcept {
#if FUSION_HAVE_CUDA
  register_device_hooks(device_kind::cuda, cuda::tensor_hooks());
#endif
}

int cuda_device_count() noexcept {
#if FUSION_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::unique_ptr<backend> make_backend(const std::string& device, gemm_precision gemm) {
  if (device == "cpu") return std::make_unique<cpu_backend>();
  const int index = cuda_index_of(device);  // throws std::runtime_error for a bad name
#if FUSION_HAVE_CUDA
  register_cuda_backend();
  return cuda::make_backend(index, gemm);
#else
  (void)index, (void)gemm;
  throw std::runtime_error("device '" + device +
                           "' requested but this build has no CUDA backend (reconfigure with -DFUSION_CUDA=ON "
                           "on a machine with the CUDA toolkit)");
#endif
}

}  // namespace fusion
