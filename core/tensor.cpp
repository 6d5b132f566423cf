#include "core/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

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

void tensor::aligned_free::operator()(std::byte* p) const noexcept { std::free(p); }

tensor::tensor(shape_t shape, dtype t) : shape_(std::move(shape)), numel_(numel_of(shape_)), dtype_(t) {
  allocate();
  if (nbytes()) std::memset(data_.get(), 0, nbytes());
}

tensor::tensor(shape_t shape, dtype t, no_init_t) : shape_(std::move(shape)), numel_(numel_of(shape_)), dtype_(t) {
  allocate();
}

tensor tensor::uninitialized(shape_t shape, dtype t) { return tensor(std::move(shape), t, no_init_t{}); }

void tensor::allocate() {
  size_t n = nbytes();
  // Round up so aligned_alloc's size requirement holds; keep one line for empty tensors too,
  // so that a scalar-shaped or empty tensor still reads as non-empty.
  size_t padded = std::max<size_t>(64, (n + 63) / 64 * 64);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, padded));
  if (!p) throw std::bad_alloc();
  data_.reset(p);
}

namespace {
std::atomic<uint64_t> copy_counter{0};
}  // namespace

uint64_t tensor::copies() noexcept { return copy_counter.load(std::memory_order_relaxed); }

tensor::tensor(const tensor& other) : shape_(other.shape_), numel_(other.numel_), dtype_(other.dtype_) {
  copy_counter.fetch_add(1, std::memory_order_relaxed);
  if (other.data_) {
    allocate();
    std::memcpy(data_.get(), other.data_.get(), nbytes());
  }
}

tensor& tensor::operator=(const tensor& other) {
  if (this != &other) {
    tensor tmp(other);
    *this = std::move(tmp);
  }
  return *this;
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
  if (data_) std::memset(data_.get(), 0, nbytes());
}

void tensor::fill(float v) { std::fill_n(f32(), numel_, v); }

void tensor::reshape(shape_t s) {
  if (numel_of(s) != numel_)
    throw std::invalid_argument("reshape " + to_string(shape_) + " -> " + to_string(s));
  shape_ = std::move(s);
}

double max_rel_diff(const tensor& a, const tensor& b) {
  if (a.shape() != b.shape()) throw std::invalid_argument("max_rel_diff: shapes differ");
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
