#include "core/device.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

namespace fusion {

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

void register_device_hooks(device_kind kind, const device_hooks* hooks) {
  if (kind != device_kind::cuda)
    throw std::invalid_argument(std::string("register_device_hooks: no hooks for device kind ") + to_string(kind));
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
