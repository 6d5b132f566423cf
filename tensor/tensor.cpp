#include "tensor/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace fusion {

int64_t numel_of(const shape_t& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + to_string(s));
    n *= d;
  }
  return n;
}

std::string to_string(const shape_t& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

const char* to_string(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::i32: return "i32";
    case dtype::f64: return "f64";
  }
  return "?";
}

size_t dtype_size(dtype t) { return t == dtype::f64 ? 8 : 4; }

namespace {

// Host storage is aligned to a cache line (vector loads, no line shared between tensors).
constexpr size_t host_alignment = 64;

static_assert(alignof(std::max_align_t) >= 2 * sizeof(void*),
              "the malloc'd address and the size must fit below the aligned one");

// Host storage comes from plain malloc, aligned by hand: the malloc'd address and the size are
// kept in the 16 bytes before the aligned one (malloc's own 16-byte alignment leaves at least
// that much). Not std::aligned_alloc: glibc before 2.38 (Debian 12 has 2.36) serves
// memalign(64, n) from a free chunk of about n + 96 bytes and keeps exactly n, so a freed
// tensor leaves a hole too small for the next tensor of its size whenever its neighbours still
// live (messages, shapes and vectors allocated after it), and the remainders it splits off do
// not merge back (glibc bug 30723). Every step frees and allocates the same sizes, so the holes
// piled up: gpt-char-small's RSS grew by about 27 MiB a step (8 GiB after 300 steps) while the
// memory in use stayed flat (mallinfo2: uordblks 80-270 MiB, fordblks 2 GiB after 60 steps,
// handed back by malloc_trim). Plain malloc fits the next tensor of the same size into the hole
// (tests/core/tensor_storage_test.cpp, bench/soak_bench.sh).
//
// Large blocks do not go back to malloc at all: they wait in bins of their exact size for the
// next tensor of that size (host_block_cache). Through malloc, the heap of a 700-step run of
// gpt-char-small held 100-300 MiB free between steps beside 90-295 MiB in use, and its size
// still crept up now and then (bench/RESULTS.md section 10); with glibc's mmap threshold fixed
// at 128 KiB instead, every large tensor was a fresh mmap whose page faults cost about a
// quarter of the throughput. A training step asks for the same sizes every step, so exact-size
// bins reuse every block, already faulted in, and the heap never sees them.
constexpr size_t cache_min_bytes = size_t{256} << 10;
constexpr size_t cache_max_bytes = size_t{1} << 30;

class host_block_cache {
 public:
  // A cached block of exactly n bytes (the malloc'd address), or null.
  void* take(size_t n) {
    std::lock_guard lock(mutex_);
    auto it = bins_.find(n);
    if (it == bins_.end() || it->second.empty()) return nullptr;
    void* raw = it->second.back();
    it->second.pop_back();
    bytes_ -= n;
    return raw;
  }
  // Keeps the block for the next request of its size; false when that would pass the bound.
  bool put(void* raw, size_t n) {
    std::lock_guard lock(mutex_);
    if (bytes_ + n > cache_max_bytes) return false;
    bins_[n].push_back(raw);
    bytes_ += n;
    return true;
  }
  size_t bytes() {
    std::lock_guard lock(mutex_);
    return bytes_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> bins_;
  size_t bytes_ = 0;
};

// Never destroyed: tensors held by static objects may be freed after any static destructor.
host_block_cache& block_cache() {
  static auto* cache = new host_block_cache;
  return *cache;
}

std::byte* host_alloc(size_t n) {
  void* raw = n >= cache_min_bytes ? block_cache().take(n) : nullptr;
  if (!raw) raw = std::malloc(n + host_alignment);
  if (!raw) return nullptr;
  auto at = (reinterpret_cast<uintptr_t>(raw) + host_alignment) & ~uintptr_t{host_alignment - 1};
  reinterpret_cast<void**>(at)[-1] = raw;
  reinterpret_cast<size_t*>(at)[-2] = n;
  return reinterpret_cast<std::byte*>(at);
}

void host_free(std::byte* p) noexcept {
  void* raw = reinterpret_cast<void**>(p)[-1];
  const size_t n = reinterpret_cast<size_t*>(p)[-2];
  try {
    if (n >= cache_min_bytes && block_cache().put(raw, n)) return;
  } catch (const std::bad_alloc&) {
    // No room for the bin's bookkeeping: give the block back instead.
  }
  std::free(raw);
}

}  // namespace

void tensor::storage_free::operator()(std::byte* p) const noexcept {
  if (device == device_kind::cpu) {
    host_free(p);
  } else if (const device_hooks* h = find_device_hooks(device)) {
    h->free(p);
  }
  // No hooks: the storage could not have been allocated, nothing to release.
}

tensor::tensor(shape_t shape, dtype t) : tensor(std::move(shape), t, device_kind::cpu) {}

tensor::tensor(shape_t shape, dtype t, device_kind d)
    : shape_(std::move(shape)), numel_(numel_of(shape_)), dtype_(t), device_(d) {
  allocate();
  if (device_ == device_kind::cpu) {
    if (nbytes()) std::memset(data_.get(), 0, nbytes());
  } else if (nbytes()) {
    device_hooks_for(device_).memset_zero(data_.get(), nbytes());
  }
}

tensor::tensor(shape_t shape, dtype t, device_kind d, no_init_t)
    : shape_(std::move(shape)), numel_(numel_of(shape_)), dtype_(t), device_(d) {
  allocate();
}

tensor tensor::uninitialized(shape_t shape, dtype t) { return tensor(std::move(shape), t, device_kind::cpu, no_init_t{}); }

tensor tensor::uninitialized(shape_t shape, dtype t, device_kind d) {
  return tensor(std::move(shape), t, d, no_init_t{});
}

void tensor::allocate() {
  size_t n = nbytes();
  // Whole lines; keep one line for empty tensors too, so that a scalar-shaped or empty tensor
  // still reads as non-empty.
  size_t padded = std::max<size_t>(64, (n + 63) / 64 * 64);
  std::byte* p = nullptr;
  if (device_ == device_kind::cpu)
    p = host_alloc(padded);
  else
    p = static_cast<std::byte*>(device_hooks_for(device_).alloc(padded));
  if (!p) throw std::bad_alloc();
  data_ = std::unique_ptr<std::byte[], storage_free>(p, storage_free{device_});
}

namespace {
std::atomic<uint64_t> copy_counter{0};
}  // namespace

uint64_t tensor::copies() noexcept { return copy_counter.load(std::memory_order_relaxed); }

size_t tensor::cached_host_bytes() { return block_cache().bytes(); }

tensor::tensor(const tensor& other)
    : shape_(other.shape_), numel_(other.numel_), dtype_(other.dtype_), device_(other.device_) {
  copy_counter.fetch_add(1, std::memory_order_relaxed);
  if (other.data_) {
    allocate();
    if (device_ == device_kind::cpu)
      std::memcpy(data_.get(), other.data_.get(), nbytes());
    else if (nbytes())
      device_hooks_for(device_).copy_d2d(data_.get(), other.data_.get(), nbytes());
  }
}

tensor& tensor::operator=(const tensor& other) {
  if (this != &other) {
    tensor tmp(other);
    *this = std::move(tmp);
  }
  return *this;
}

tensor tensor::to_device(device_kind d) const& {
  if (d == device_) return tensor(*this);
  tensor out;
  out.shape_ = shape_;
  out.numel_ = numel_;
  out.dtype_ = dtype_;
  out.device_ = d;
  if (!data_) return out;
  out.allocate();
  if (nbytes() == 0) return out;
  if (d == device_kind::cpu)
    device_hooks_for(device_).copy_d2h(out.data_.get(), data_.get(), nbytes());
  else if (device_ == device_kind::cpu)
    device_hooks_for(d).copy_h2d(out.data_.get(), data_.get(), nbytes());
  else
    throw std::logic_error(std::string("tensor::to_device: ") + to_string(device_) + " -> " + to_string(d));
  return out;
}

tensor tensor::to_device(device_kind d) && {
  if (d == device_) return std::move(*this);
  return static_cast<const tensor&>(*this).to_device(d);
}

void tensor::check_cpu(const char* what) const {
  if (device_ != device_kind::cpu)
    throw std::logic_error(std::string("tensor::") + what + " on a " + fusion::to_string(device_) +
                           " tensor: move it to the CPU first (to_cpu())");
}

tensor tensor::from(shape_t shape, std::span<const float> values) {
  tensor t(std::move(shape), dtype::f32);
  if (static_cast<size_t>(t.numel()) != values.size())
    throw std::invalid_argument("tensor::from: " + std::to_string(values.size()) + " values for shape " +
                                to_string(t.shape()));
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

tensor tensor::from_i32(shape_t shape, std::span<const int32_t> values) {
  tensor t(std::move(shape), dtype::i32);
  if (static_cast<size_t>(t.numel()) != values.size())
    throw std::invalid_argument("tensor::from_i32: " + std::to_string(values.size()) +
                                " values for shape " + to_string(t.shape()));
  std::copy(values.begin(), values.end(), t.i32());
  return t;
}

int64_t tensor::dim(int i) const {
  int r = static_cast<int>(shape_.size());
  int j = i < 0 ? r + i : i;
  if (j < 0 || j >= r)
    throw std::out_of_range("tensor::dim(" + std::to_string(i) + ") on shape " + to_string(shape_));
  return shape_[j];
}

void tensor::check_type(dtype want) const {
  if (dtype_ != want)
    throw std::logic_error(std::string("tensor holds ") + to_string(dtype_) + ", accessed as " + to_string(want));
}

tensor tensor::to(dtype t) const {
  if (t == dtype_) return *this;
  check_cpu("to(dtype)");
  tensor out(shape_, t);
  if (dtype_ == dtype::f32 && t == dtype::f64)
    std::copy_n(f32(), numel_, out.f64());
  else if (dtype_ == dtype::f64 && t == dtype::f32)
    std::copy_n(f64(), numel_, out.f32());
  else
    throw std::logic_error(std::string("tensor::to: ") + to_string(dtype_) + " -> " + to_string(t));
  return out;
}

void tensor::zero() {
  if (!data_ || nbytes() == 0) return;
  if (device_ == device_kind::cpu)
    std::memset(data_.get(), 0, nbytes());
  else
    device_hooks_for(device_).memset_zero(data_.get(), nbytes());
}

void tensor::fill(float v) {
  if (device_ == device_kind::cpu) {
    std::fill_n(f32(), numel_, v);
  } else if (numel_ > 0) {
    device_hooks_for(device_).fill_f32(f32(), numel_, v);
  }
}

void tensor::reshape(shape_t s) {
  if (numel_of(s) != numel_)
    throw std::invalid_argument("reshape " + to_string(shape_) + " -> " + to_string(s));
  shape_ = std::move(s);
}

double max_rel_diff(const tensor& a_any, const tensor& b_any) {
  if (a_any.shape() != b_any.shape()) throw std::invalid_argument("max_rel_diff: shapes differ");
  // Device tensors are compared on a host copy; CPU tensors are used in place.
  tensor a_host, b_host;
  if (a_any.is_cuda()) a_host = a_any.to_cpu();
  if (b_any.is_cuda()) b_host = b_any.to_cpu();
  const tensor& a = a_any.is_cuda() ? a_host : a_any;
  const tensor& b = b_any.is_cuda() ? b_host : b_any;
  auto at = [](const tensor& t, int64_t i) -> double {
    return t.type() == dtype::f64 ? t.f64()[i] : t.f32()[i];
  };
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = at(a, i), y = at(b, i);
    worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
  }
  return worst;
}

}  // namespace fusion
