// Helpers of the topk codec tests (codec_test.cpp, codec_decode_test.cpp).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compression/topk.hpp"

namespace fusion::codec_test {

using payload_t = std::vector<std::byte>;
inline const float nan_f = std::numeric_limits<float>::quiet_NaN(), inf_f = std::numeric_limits<float>::infinity();

inline uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }
inline uint32_t key_of(float v) { return bits(v) & 0x7fffffffu; }
template <class T>
T rd(const payload_t& p, size_t off) {
  T v;
  std::memcpy(&v, p.data() + off, sizeof v);
  return v;
}
template <class T>
void wr(payload_t& p, size_t off, T v) {
  std::memcpy(p.data() + off, &v, sizeof v);
}

// The kept indices of a block, by sorting (|x| key descending, index ascending).
inline std::vector<uint32_t> reference_kept(const float* x, uint32_t len, uint32_t k) {
  std::vector<uint32_t> idx(len);
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    return key_of(x[a]) != key_of(x[b]) ? key_of(x[a]) > key_of(x[b]) : a < b;
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

inline std::vector<float> normal_data(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

// Decoding must fail with `reason` in the message and leave dst as it was.
inline void check_rejected(const payload_t& p, size_t n, const std::string& reason) {
  std::vector<float> d(n, 42.0f);
  const std::string err = decode_topk(p, d).error();
  CAPTURE(err);
  CHECK(err.find(reason) != std::string::npos);
  CHECK(std::all_of(d.begin(), d.end(), [](float v) { return v == 42.0f; }));
}

}  // namespace fusion::codec_test
