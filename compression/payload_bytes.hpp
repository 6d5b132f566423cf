// Byte-level pieces every codec payload is written and read with (compression/topk.cpp,
// compression/quant.cpp): sizes that saturate instead of wrapping, so a hostile header can only
// announce "too large"; little-endian loads and stores through memcpy; the element count of a
// payload from its header. Internal to compression/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace fusion::payload_bytes {

/// What a saturated size reads: no payload is that long.
inline constexpr uint64_t saturated = UINT64_MAX;

inline uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? saturated : r;
}
inline uint64_t sat_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? saturated : r;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

/// The element count at byte 8 of a payload that starts with the 4-byte `magic` and holds at
/// least `header_bytes`; false for any other payload.
inline bool elements(std::span<const std::byte> payload, const char (&magic)[5], size_t header_bytes, uint64_t& n) {
  if (payload.size() < header_bytes || std::memcmp(payload.data(), magic, 4) != 0) return false;
  n = load<uint64_t>(payload.data() + 8);
  return true;
}

}  // namespace fusion::payload_bytes
