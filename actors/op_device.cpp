#include "actors/op_device.hpp"

#include <cstdlib>
#include <stdexcept>

#include "core/param_init.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

status device_usable(const std::string& device) {
  int index = -1;
  try {
    index = cuda_index_of(device);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (index < 0) return {};
  const std::string want = "cuda:" + std::to_string(index) + " requested but ";
  if (!cuda_compiled())
    return fail(want + "no CUDA device is available: this build has no CUDA backend (rebuild with -DFUSION_CUDA=ON "
                       "on a machine with the CUDA toolkit)");
  const int n = cuda_device_count();
  if (n == 0) return fail(want + "no CUDA device is available (no GPU or no driver on this machine)");
  if (index >= n)
    return fail(want + "only " + std::to_string(n) + " CUDA device(s) are available (cuda:0..cuda:" +
                std::to_string(n - 1) + ")");
  return {};
}

std::vector<std::string> split_patterns(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    start = comma + 1;
  }
  return out;
}

std::string device_for_op(const std::string& device, const std::vector<std::string>& cpu_ops,
                          const std::string& op_name) {
  if (device == "cpu") return device;
  for (auto& p : cpu_ops)
    if (glob_match(p, op_name)) return "cpu";
  return device;
}

op_compute make_op_compute(const std::string& device, gemm_precision gemm, const std::string& kind,
                           const attr_map& attrs, const std::vector<shape_t>& input_shapes, const std::string& name,
                           uint64_t seed, const optim_config& optim) {
  op_compute c;
  // A data input only passes host tensors on: a device (stream, cuBLAS handle) would be wasted.
  c.dev = make_backend(kind == "input" ? std::string("cpu") : device, gemm);
  if (kind == "input") return c;
  c.impl = c.dev->make_op(kind, attrs);
  c.param_specs = c.impl->params(input_shapes);
  for (auto& ps : c.param_specs) {
    tensor host;
    init_param(host, ps, seed, name + "/" + ps.name);
    c.params.push_back(c.dev->upload(std::move(host)));
    c.grads.push_back(c.dev->zeros(ps.shape, dtype::f32));
    c.m.push_back(c.dev->zeros(ps.shape, dtype::f32));
    c.v.push_back(c.dev->zeros(optim.kind == "sgd" ? shape_t{0} : ps.shape, dtype::f32));
  }
  c.buffer_specs = c.impl->buffers(input_shapes);
  for (auto& bs : c.buffer_specs) c.buffers.push_back(c.dev->upload(init_buffer(bs)));
  c.dev->synchronize();  // report a failed upload here, at spawn time
  return c;
}

tensor to_host(backend& dev, tensor t) {
  if (!t.is_cuda()) return t;
  return dev.download(t);
}

float read_scalar(backend& dev, const tensor& t) {
  if (!t.is_cuda()) return t.f32()[0];
  return dev.download(t).f32()[0];
}

std::vector<std::string> state_key_names(const std::string& op_name, const std::vector<param_spec>& params,
                                         const std::vector<buffer_spec>& buffers, bool outer) {
  std::vector<std::string> keys;
  for (auto& p : params)
    for (const char* suffix : {"", ".m", ".v"}) keys.push_back(op_name + "/" + p.name + suffix);
  for (auto& b : buffers) keys.push_back(op_name + "/" + b.name);
  if (!outer) return keys;
  for (auto& p : params)
    for (const char* suffix : {".outer", ".outer_m"}) keys.push_back(op_name + "/" + p.name + suffix);
  for (auto& b : buffers) keys.push_back(op_name + "/" + b.name + ".outer");
  return keys;
}

std::vector<std::string> state_key_names(const std::string& op_name, const std::string& kind, const attr_map& attrs,
                                         const std::vector<shape_t>& input_shapes, bool outer) {
  if (kind == "input") return {};
  auto impl = make_op(kind, attrs);
  return state_key_names(op_name, impl->params(input_shapes), impl->buffers(input_shapes), outer);
}

}  // namespace fusion
