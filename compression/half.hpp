// Bit-exact fp32 <-> fp16 / bf16 conversions of the topk codec (compression/topk.cpp). Plain
// integer arithmetic, no dependence on the floating-point environment (FTZ/DAZ, rounding
// mode) or on F16C, so a GPU implementation can reproduce every bit. Branch-free, so loops
// over arrays vectorise.
//
// fp32 -> fp16 / bf16: round to nearest, ties to even; overflow rounds to +-inf; subnormal
// results are kept (never flushed); the sign survives (also on zero). NaN stays NaN: sign
// kept, quiet bit set, payload truncated to its top bits (fp16: sign | 0x7e00 | mant >> 13,
// bf16: sign | 0x7fc0 | mant >> 16). fp16 / bf16 -> fp32 is exact (NaN payloads shift back).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace fusion {

namespace half_detail {
// c ? a : b without a branch (keeps the loops over arrays if-converted and vectorised).
constexpr uint32_t select(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}
}  // namespace half_detail

/// fp32 -> fp16 bits, round to nearest even.
constexpr uint16_t f32_to_f16_bits(float f) {
  using half_detail::select;
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal result: rebias the exponent and round the 13 dropped bits (carry may reach inf).
  const uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal result (a < 2^-14): the 24-bit significand shifted right by 126 - exponent,
  // then rounded; a shift of 25 or more always rounds to zero, so it is capped at 31.
  const uint32_t e = a >> 23;
  const uint32_t shift = std::min(126u - std::min(e, 112u), 31u);
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  const uint32_t sub = q + select(rem > half, 1u, select(rem == half, q & 1u, 0u));
  const uint32_t special = 0x7c00u | (select(a > 0x7f800000u, 0x200u | ((a >> 13) & 0x3ffu), 0u));
  const uint32_t r = select(a >= 0x47800000u, special, select(a < 0x38800000u, sub, normal));
  return static_cast<uint16_t>(r | sign);
}

/// fp16 bits -> fp32 (exact).
constexpr float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  // Subnormal: m * 2^-24 is exact in fp32 and a normal number there.
  const uint32_t sub = std::bit_cast<uint32_t>(static_cast<float>(m) * 0x1p-24f);
  const uint32_t bits = e == 0 ? sub : (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
  return std::bit_cast<float>(bits | sign);
}

/// fp32 -> bf16 bits, round to nearest even.
constexpr uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t nan = (x >> 16) | 0x40u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/// bf16 bits -> fp32 (exact).
constexpr float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace fusion
