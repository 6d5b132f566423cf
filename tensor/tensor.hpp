// Dense tensor: shape, element type and owned storage on one device (tensor/device.hpp).
//
// Tensors are the payload of every forward and backward message. They are deep-copyable (CAF
// messages are copy-on-write, so a copy happens only when a message fans out) and cheap to move.
// CPU storage is 64-byte aligned host memory. CUDA storage is device memory reached through the
// hook table of tensor/device.hpp (so this header needs no CUDA); for a CUDA tensor, data<T>(),
// f32(), bytes() and friends return DEVICE pointers, which host code must not dereference:
// move the tensor with to_cpu() / to_device() (or a backend's upload/download) first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/device.hpp"

namespace fusion {

/// Element type of a tensor. Token ids travel as i32, activations and parameters as f32; f64
/// exists so tests can run the same op code in double precision (finite-difference checks).
enum class dtype : uint8_t { f32 = 0, i32 = 1, f64 = 2 };

/// dtype of a C++ element type.
template <class T> constexpr dtype dtype_of();
template <> constexpr dtype dtype_of<float>() { return dtype::f32; }
template <> constexpr dtype dtype_of<double>() { return dtype::f64; }
template <> constexpr dtype dtype_of<int32_t>() { return dtype::i32; }

using shape_t = std::vector<int64_t>;

/// Number of elements of a shape (1 for a scalar shape `{}`).
int64_t numel_of(const shape_t& s);

/// "[2, 3, 4]".
std::string to_string(const shape_t& s);
const char* to_string(dtype t);

/// Size in bytes of one element.
size_t dtype_size(dtype t);

/// A dense, row-major tensor on the CPU or on a CUDA device.
class tensor {
 public:
  tensor() = default;
  /// Zero-initialised CPU tensor of the given shape.
  explicit tensor(shape_t shape, dtype t = dtype::f32);
  /// Zero-initialised tensor on device `d` (std::runtime_error when `d` has no runtime registered).
  tensor(shape_t shape, dtype t, device_kind d);

  tensor(const tensor& other);
  tensor& operator=(const tensor& other);
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) noexcept = default;

  /// Process-wide number of deep copies made so far (copy construction and copy assignment, on
  /// any device). Tests use it to show that activations move between local actors instead of
  /// being copied. Transfers between devices (to_device, to_cpu) are not counted.
  static uint64_t copies() noexcept;
  /// Bytes of freed host storage kept for the next tensor of the same size: blocks of 256 KiB and
  /// more, binned by exact size, at most 1 GiB in all (tensor/tensor.cpp says why).
  static size_t cached_host_bytes();

  /// Storage left uninitialised: for outputs that the producer overwrites entirely.
  static tensor uninitialized(shape_t shape, dtype t = dtype::f32);
  /// Same on device `d`.
  static tensor uninitialized(shape_t shape, dtype t, device_kind d);
  /// A tensor holding a copy of `values` with the given shape (sizes must agree).
  static tensor from(shape_t shape, std::span<const float> values);
  static tensor from_i32(shape_t shape, std::span<const int32_t> values);

  const shape_t& shape() const noexcept { return shape_; }
  size_t rank() const noexcept { return shape_.size(); }
  /// Size of dimension `i`; negative `i` counts from the back.
  int64_t dim(int i) const;
  int64_t numel() const noexcept { return numel_; }
  size_t nbytes() const noexcept { return numel_ * dtype_size(dtype_); }
  dtype type() const noexcept { return dtype_; }
  /// Where the storage lives (device_kind::cpu for a default-constructed tensor).
  device_kind device() const noexcept { return device_; }
  bool is_cuda() const noexcept { return device_ == device_kind::cuda; }
  bool empty() const noexcept { return data_ == nullptr; }

  /// A copy of this tensor on device `d` (a deep copy, counted by copies(), when already there).
  /// CPU -> CUDA and CUDA -> CPU copies synchronise with work queued on the device.
  tensor to_device(device_kind d) const&;
  /// Same, but moves instead of copying when the tensor is already on `d`.
  tensor to_device(device_kind d) &&;
  /// to_device(device_kind::cpu).
  tensor to_cpu() const& { return to_device(device_kind::cpu); }
  tensor to_cpu() && { return std::move(*this).to_device(device_kind::cpu); }

  /// Typed element access; throws std::logic_error when T does not match type().
  /// On a CUDA tensor the pointer is a device pointer (for kernels, cuBLAS and the hooks only).
  template <class T> T* data() {
    check_type(dtype_of<T>());
    return reinterpret_cast<T*>(data_.get());
  }
  template <class T> const T* data() const {
    check_type(dtype_of<T>());
    return reinterpret_cast<const T*>(data_.get());
  }
  float* f32() { return data<float>(); }
  const float* f32() const { return data<float>(); }
  int32_t* i32() { return data<int32_t>(); }
  const int32_t* i32() const { return data<int32_t>(); }
  double* f64() { return data<double>(); }
  const double* f64() const { return data<double>(); }
  /// A copy converted to another floating type (f32 <-> f64); CPU tensors only (std::logic_error).
  tensor to(dtype t) const;
  std::byte* bytes() noexcept { return data_.get(); }
  const std::byte* bytes() const noexcept { return data_.get(); }
  std::span<float> f32_span() { return {f32(), static_cast<size_t>(numel_)}; }
  std::span<const float> f32_span() const { return {f32(), static_cast<size_t>(numel_)}; }

  /// Sets every byte to zero (on any device).
  void zero();
  /// Sets every element of an f32 tensor to v (on any device).
  void fill(float v);
  /// Reinterprets the same elements under another shape of equal element count.
  void reshape(shape_t s);

 private:
  // Frees host memory (tensor.cpp host_alloc) and device memory through the device's hooks.
  struct storage_free {
    storage_free() noexcept : device(device_kind::cpu) {}
    explicit storage_free(device_kind d) noexcept : device(d) {}
    void operator()(std::byte* p) const noexcept;
    device_kind device;
  };
  struct no_init_t {};
  tensor(shape_t shape, dtype t, device_kind d, no_init_t);
  void allocate();
  void check_type(dtype want) const;
  void check_cpu(const char* what) const;

  shape_t shape_;
  int64_t numel_ = 0;
  dtype dtype_ = dtype::f32;
  device_kind device_ = device_kind::cpu;
  std::unique_ptr<std::byte[], storage_free> data_;
};

/// Largest |a-b| / max(1, |b|) over all elements of two floating tensors; shapes must agree.
/// CUDA tensors are copied to the host first.
double max_rel_diff(const tensor& a, const tensor& b);

}  // namespace fusion
