#include "scheduler/op_timing.hpp"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/param_init.hpp"
#include "ops/backend.hpp"
#include "ops/cpu_quota.hpp"
#include "ops/optim.hpp"

#if FUSION_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusion {

namespace {

using wall_clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

long minor_faults() {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_minflt;
}

double seconds_since(wall_clock::time_point t0) {
  return std::chrono::duration<double>(wall_clock::now() - t0).count();
}

// glibc serves large blocks with mmap until a large block has been freed, and only then raises
// its mmap and trim thresholds (to the freed size, and twice that). A training node passes that
// point within its first micro-batches, and from then on it recycles activation memory on the
// heap. A fresh process has not: every output here would be a new mapping whose pages fault in
// at first touch (milliseconds per MiB on a VM, 40x the compute of a small op). Freeing one
// 16 MiB block puts the allocator where training has it.
void warm_allocator() {
  void* volatile block = std::malloc(size_t{16} << 20);
  std::free(block);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A host tensor of `shape` and `type`: normal values for floats, zeros for i32 (valid token ids
// and targets for any vocabulary).
tensor random_tensor(const shape_t& shape, dtype type, std::mt19937_64& rng, float stddev) {
  tensor t(shape, type);
  std::normal_distribution<float> dist(0.0f, stddev);
  if (type == dtype::f32)
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
  else if (type == dtype::f64)
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t;
}

// Times calls of one op on one backend. CPU: thread CPU time (the kernels run on the calling
// thread; with more than one BLAS thread the helpers' time would be missed). CUDA: wall time up
// to the end of a synchronize().
class call_timer {
 public:
  call_timer(backend& dev, const timing_options& o) : dev_(dev), options_(o) {}

  // Warm-up calls, then the median of options.repeats calls (a single warm-up and a single timed
  // call when the first call was slow). On the CPU the warm-up goes on until a call faults no
  // page in (at least two, at most options.warmups calls): the allocator needs a few rounds of a call's
  // pattern (allocate the new output, free the last one) before it recycles memory instead of
  // growing the heap into fresh pages, which cost more than a small op's compute on a VM.
  template <class Fn>
  double median_of(Fn&& fn) {
    long faults = minor_faults();
    double first = once(fn);
    const bool slow = first > options_.slow_call_s;
    const bool cpu = dev_.kind() == device_kind::cpu;
    for (int i = 1; i < options_.warmups && !slow; ++i) {
      long now = minor_faults();
      // Steady once the last warm-up call faulted nothing in (a GPU: after two calls).
      if (i > 1 && (!cpu || now == faults)) break;
      faults = now;
      once(fn);
    }
    int n = slow ? 1 : std::max(1, options_.repeats);
    std::vector<double> times;
    for (int i = 0; i < n; ++i) times.push_back(once(fn));
    return median(std::move(times));
  }

 private:
  template <class Fn>
  double once(Fn& fn) {
    if (dev_.kind() == device_kind::cpu) {
      double c0 = thread_cpu_seconds();
      fn();
      return thread_cpu_seconds() - c0;
    }
    auto t0 = wall_clock::now();
    fn();
    dev_.synchronize();
    return seconds_since(t0);
  }

  backend& dev_;
  const timing_options& options_;
};

op_timing time_one(backend& dev, const op_signature& s, const timing_options& options, std::mt19937_64& rng) {
  auto impl = dev.make_op(s.kind, attr_map{s.attrs});
  if (s.input_types.size() != s.input_shapes.size())
    throw std::runtime_error("input types and shapes disagree");
  std::vector<tensor> inputs;
  std::vector<dtype> types;
  for (size_t i = 0; i < s.input_shapes.size(); ++i) {
    auto type = static_cast<dtype>(s.input_types[i]);
    types.push_back(type);
    inputs.push_back(dev.upload(random_tensor(s.input_shapes[i], type, rng, 1.0f)));
  }
  auto specs = impl->params(s.input_shapes);
  std::vector<tensor> params, grads, m, v;
  for (auto& ps : specs) {
    tensor host(ps.shape, dtype::f32);
    if (ps.init == param_init::normal)
      host = random_tensor(ps.shape, dtype::f32, rng, ps.stddev);
    else if (ps.init == param_init::ones)
      for (int64_t i = 0; i < host.numel(); ++i) host.f32()[i] = 1.0f;
    params.push_back(dev.upload(std::move(host)));
    grads.push_back(dev.zeros(ps.shape, dtype::f32));
    m.push_back(dev.zeros(ps.shape, dtype::f32));
    v.push_back(dev.zeros(ps.shape, dtype::f32));
  }
  // Non-trainable state (batch norm's running statistics): updated by every timed call, which
  // is what training does too.
  std::vector<tensor> buffers;
  for (auto& bs : impl->buffers(s.input_shapes)) buffers.push_back(dev.upload(init_buffer(bs)));
  std::vector<const tensor*> in_ptrs, p_ptrs;
  std::vector<tensor*> g_ptrs, b_ptrs;
  for (auto& t : buffers) b_ptrs.push_back(&t);
  for (auto& t : inputs) in_ptrs.push_back(&t);
  for (auto& t : params) p_ptrs.push_back(&t);
  for (auto& t : grads) g_ptrs.push_back(&t);
  const shape_t out_shape = impl->infer_shape(s.input_shapes, types);
  dev.synchronize();

  call_timer timer(dev, options);
  op_timing out;
  // Like the op actor: the output's allocation is part of the forward.
  tensor output;
  std::vector<tensor> saved;
  out.forward_s = timer.median_of([&] {
    saved.clear();
    output = dev.empty(out_shape, dtype::f32);
    impl->forward({in_ptrs, p_ptrs, &output, &saved, dev.context(), b_ptrs});
  });
  // The saved activations of the last forward serve every backward call (backward only reads
  // them); gradients accumulate, which costs the same as the first time.
  tensor dout = dev.upload(random_tensor(out_shape, dtype::f32, rng, 1.0f));
  out.backward_s = timer.median_of([&] {
    std::vector<tensor> din(inputs.size());
    std::vector<tensor*> din_ptrs(inputs.size(), nullptr);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (types[i] == dtype::i32 || !impl->input_has_grad(i)) continue;
      din[i] = dev.zeros(s.input_shapes[i], dtype::f32);
      din_ptrs[i] = &din[i];
    }
    impl->backward({in_ptrs, p_ptrs, &dout, &saved, din_ptrs, g_ptrs, dev.context()});
  });
  if (!params.empty()) {
    const optim_config adamw;  // the defaults are AdamW's
    int64_t step = 0;
    out.update_s = timer.median_of([&] {
      ++step;
      for (size_t i = 0; i < params.size(); ++i)
        dev.adamw_update(params[i], grads[i], m[i], v[i], step, adamw.lr, adamw, specs[i].decay, 1.0f);
    });
  }
  return out;
}

}  // namespace

std::vector<op_signature> op_signatures(const graph& g) {
  std::vector<op_signature> out;
  for (int id : distinct_ops(g)) {
    const graph_node& n = g.nodes[id];
    op_signature s;
    s.key = op_key(g, id);
    s.kind = n.kind;
    s.attrs = n.attrs.values();
    for (int p : n.inputs) {
      s.input_shapes.push_back(g.nodes[p].shape);
      s.input_types.push_back(static_cast<uint8_t>(g.nodes[p].type));
    }
    out.push_back(std::move(s));
  }
  return out;
}

double measure_cpu_share(std::chrono::milliseconds window) {
  // Work in small slices between clock reads, so the loop notices the end of the window within
  // microseconds; `sink` keeps the compiler from dropping the work.
  volatile double sink = 0;
  double x = 1.0;
  const auto t0 = wall_clock::now();
  const double c0 = thread_cpu_seconds();
  const auto until = t0 + window;
  while (wall_clock::now() < until) {
    for (int i = 0; i < 2000; ++i) x = x * 1.0000001 + 1e-9;
    sink = x;
  }
  (void)sink;
  double wall = seconds_since(t0);
  double cpu = thread_cpu_seconds() - c0;
  return wall > 0 ? std::max(cpu / wall, 1e-3) : 1.0;
}

uint64_t free_memory_bytes(const std::string& device) {
  int index = -1;
  try {
    index = cuda_index_of(device);
  } catch (const std::exception&) {
    return 0;
  }
  if (index >= 0) {
#if FUSION_HAVE_CUDA
    size_t free = 0, total = 0;
    if (cudaSetDevice(index) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();  // clear the error, so that the thread's next CUDA call does not report it
      return 0;
    }
    return free;
#else
    return 0;
#endif
  }
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      uint64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  return 0;
}

void take_measured(node_profile& n, device_timing t) {
  n.ops = std::move(t.ops);
  n.cpu_share = t.cpu_share;
  n.quota = t.quota;
}

device_timing time_ops(const std::string& device, const std::vector<op_signature>& ops,
                       const timing_options& options) {
  const auto t0 = wall_clock::now();
  device_timing out;
  out.device = normalize_device(device);
  auto dev = make_backend(out.device);
  const bool cpu = dev->kind() == device_kind::cpu;
  out.cpu_share = cpu ? measure_cpu_share(options.share_window) : 1.0;
  // Under a quota below one core the ops are timed at full speed (their CPU time) and the
  // estimator keeps the quota's budget; otherwise a share below 1 (other processes on the core)
  // stretches every op alike.
  const cpu_quota quota = cpu ? process_cpu_quota() : cpu_quota{};
  if (quota.binds()) out.quota = quota;
  warm_allocator();
  std::mt19937_64 rng(0x5eed);
  for (auto& s : ops) {
    op_timing t;
    try {
      t = time_one(*dev, s, options, rng);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot time op " + s.key + " on " + out.device + ": " + e.what());
    }
    if (cpu && !quota.binds()) {
      // Wall-equivalent: what the op takes when the process gets only `share` of a core.
      t.forward_s /= out.cpu_share;
      t.backward_s /= out.cpu_share;
      t.update_s /= out.cpu_share;
    }
    out.ops[s.key] = t;
  }
  out.memory_bytes = free_memory_bytes(out.device);
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace fusion
