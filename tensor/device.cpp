#include "tensor/device.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fusion {

int cuda_index_of(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0) {
    const std::string digits = device.substr(5);
    char* end = nullptr;
    const long v = std::strtol(digits.c_str(), &end, 10);
    if (!digits.empty() && *end == '\0' && v >= 0 && v <= 1024 && digits.find_first_of("+- ") == std::string::npos)
      return static_cast<int>(v);
  }
  throw std::runtime_error("bad device '" + device + "' (use cpu, cuda or cuda:N, e.g. cuda:0)");
}

std::string normalize_device(const std::string& device) {
  const int n = cuda_index_of(device);
  return n < 0 ? std::string("cpu") : "cuda:" + std::to_string(n);
}

bool same_device(const std::string& a, const std::string& b) {
  try {
    return normalize_device(a) == normalize_device(b);
  } catch (const std::runtime_error&) {
    return a == b;
  }
}

namespace {

// One slot per non-CPU device kind. Atomic so that registration at static initialisation and
// lookups from actor threads need no lock.
std::atomic<const device_hooks*> cuda_slot{nullptr};

}  // namespace

const char* to_string(device_kind d) {
  switch (d) {
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(gemm_precision p) noexcept { return p == gemm_precision::bf16 ? "bf16" : "fp32"; }

gemm_precision parse_gemm_precision(const std::string& name) {
  if (name == "fp32") return gemm_precision::fp32;
  if (name == "bf16") return gemm_precision::bf16;
  throw std::runtime_error("precision '" + name + "' is not one of fp32, bf16");
}

void register_device_hooks(device_kind kind, const device_hooks* hooks) {
  if (kind != device_kind::cuda)
    throw std::runtime_error(std::string("register_device_hooks: no hooks for device kind ") + to_string(kind));
  cuda_slot.store(hooks, std::memory_order_release);
}

const device_hooks* find_device_hooks(device_kind kind) noexcept {
  if (kind != device_kind::cuda) return nullptr;
  return cuda_slot.load(std::memory_order_acquire);
}

const device_hooks& device_hooks_for(device_kind kind) {
  if (const device_hooks* h = find_device_hooks(kind)) return *h;
  if (kind == device_kind::cpu) throw std::logic_error("device_hooks_for(cpu): CPU storage needs no hooks");
  throw std::runtime_error(
      std::string("no ") + to_string(kind) +
      " runtime registered: this build has no CUDA backend (configure with -DFUSION_CUDA=ON) or "
      "fusion::register_cuda_backend() was not called");
}

}  // namespace fusion
