// Row reductions and exp written so that GCC/Clang auto-vectorise them at -O3 without
// -ffast-math (which the build does not use): float sums keep 16 independent partial sums
// (reassociation the compiler may not do on its own), and exp_fast(float) is a branch-free
// polynomial instead of a libm call. Used by the softmax-style CPU kernels (attention,
// cross_entropy) and layernorm. The double versions stay exact-ish (std::exp) for gradient checks.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace fusion::cpu {

/// exp(x) for float with about 2 ulp error (Cephes polynomial, range reduction by ln 2);
/// returns 0 below -87.3 (no denormals), +inf above 88.7, NaN for NaN. Inlines into vector loops.
inline float exp_fast(float x) {
  const float hi = 88.7f, lo = -87.3f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22, vectorises everywhere).
  const float magic = 12582912.0f;
  float n = (xc * 1.44269504088896341f + magic) - magic;
  float r = xc - n * 0.693359375f;  // ln2 split in two so r is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  y *= std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  y = x < lo ? 0.0f : y;
  y = x > hi ? HUGE_VALF : y;
  return x != x ? x : y;
}

/// exp(x) for double: libm, so finite-difference checks see the exact function.
inline double exp_fast(double x) { return std::exp(x); }

/// Number of independent partial sums in the reductions below (one AVX-512 float register).
inline constexpr int vec_lanes = 16;

/// sum over i in [0, n) of f(i), accumulated in vec_lanes interleaved partial sums.
template <class T, class F>
inline T lane_sum(int64_t n, F f) {
  T acc[vec_lanes] = {};
  int64_t i = 0;
  for (; i + vec_lanes <= n; i += vec_lanes)
    for (int l = 0; l < vec_lanes; ++l) acc[l] += f(i + l);
  for (int l = 0; i < n; ++i, ++l) acc[l] += f(i);
  T s = 0;
  for (int l = 0; l < vec_lanes; ++l) s += acc[l];
  return s;
}

/// max over x[0, n), n >= 1 (NaN-propagation is not guaranteed).
template <class T>
inline T row_max(const T* x, int64_t n) {
  T acc[vec_lanes];
  std::fill(acc, acc + vec_lanes, x[0]);
  int64_t i = 0;
  for (; i + vec_lanes <= n; i += vec_lanes)
    for (int l = 0; l < vec_lanes; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] = acc[l] > x[i] ? acc[l] : x[i];
  return *std::max_element(acc, acc + vec_lanes);
}

/// y[i] = exp(x[i] - shift) for i in [0, n) (y may equal x); returns the sum of the y[i].
template <class T>
inline T exp_shift_sum(T* y, const T* x, int64_t n, T shift) {
  return lane_sum<T>(n, [&](int64_t i) { return y[i] = exp_fast(x[i] - shift); });
}

/// sum over i in [0, n) of exp(x[i] - shift), without writing anything.
template <class T>
inline T sum_exp_shift(const T* x, int64_t n, T shift) {
  return lane_sum<T>(n, [&](int64_t i) { return exp_fast(x[i] - shift); });
}

}  // namespace fusion::cpu
