// Dense tensor: shape, element type, owned 64-byte aligned storage and a device tag.
//
// Tensors are the payload of every forward and backward message. They are deep-copyable (CAF
// messages are copy-on-write, so a copy happens only when a message fans out) and cheap to move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fusion {

/// Element type of a tensor. Token ids travel as i32, activations and parameters as f32; f64
/// exists so tests can run the same op code in double precision (finite-difference checks).
enum class dtype : uint8_t { f32 = 0, i32 = 1, f64 = 2 };

/// dtype of a C++ element type.
template <class T> constexpr dtype dtype_of();
template <> constexpr dtype dtype_of<float>() { return dtype::f32; }
template <> constexpr dtype dtype_of<double>() { return dtype::f64; }
template <> constexpr dtype dtype_of<int32_t>() { return dtype::i32; }

/// Where a tensor's storage lives.
enum class device_kind : uint8_t { cpu = 0, cuda = 1 };

using shape_t = std::vector<int64_t>;

/// Number of elements of a shape (1 for a scalar shape `{}`).
int64_t numel_of(const shape_t& s);

/// "[2, 3, 4]".
std::string to_string(const shape_t& s);
const char* to_string(dtype t);

/// Size in bytes of one element.
size_t dtype_size(dtype t);

/// A dense, row-major tensor on the CPU.
class tensor {
 public:
  tensor() = default;
  /// Zero-initialised tensor of the given shape.
  explicit tensor(shape_t shape, dtype t = dtype::f32);

  tensor(const tensor& other);
  tensor& operator=(const tensor& other);
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) noexcept = default;

  /// Process-wide number of deep copies made so far (copy construction and copy assignment).
  /// Tests use it to show that activations move between local actors instead of being copied.
  static uint64_t copies() noexcept;

  /// Storage left uninitialised: for outputs that the producer overwrites entirely.
  static tensor uninitialized(shape_t shape, dtype t = dtype::f32);
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
  device_kind device() const noexcept { return device_kind::cpu; }
  bool empty() const noexcept { return data_ == nullptr; }

  /// Typed element access; throws std::logic_error when T does not match type().
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
  /// A copy converted to another floating type (f32 <-> f64).
  tensor to(dtype t) const;
  std::byte* bytes() noexcept { return data_.get(); }
  const std::byte* bytes() const noexcept { return data_.get(); }
  std::span<float> f32_span() { return {f32(), static_cast<size_t>(numel_)}; }
  std::span<const float> f32_span() const { return {f32(), static_cast<size_t>(numel_)}; }

  void zero();
  void fill(float v);
  /// Reinterprets the same elements under another shape of equal element count.
  void reshape(shape_t s);

 private:
  struct aligned_free {
    void operator()(std::byte* p) const noexcept;
  };
  struct no_init_t {};
  tensor(shape_t shape, dtype t, no_init_t);
  void allocate();
  void check_type(dtype want) const;

  shape_t shape_;
  int64_t numel_ = 0;
  dtype dtype_ = dtype::f32;
  std::unique_ptr<std::byte[], aligned_free> data_;
};

/// Largest |a-b| / max(1, |b|) over all elements of two floating tensors; shapes must agree.
double max_rel_diff(const tensor& a, const tensor& b);

}  // namespace fusion
