// Fuzzes the compression payload decoders of the codec table (compression/codec.hpp): every
// codec a wire header can name (raw, topk: compression/topk.hpp, int8 and int4:
// compression/quant.hpp) gets the same bytes, so a codec added to the table is fuzzed without
// touching this file: headers, block sizes, kept counts, index lists and bitmaps, scales, codes,
// padding, exact length.
//
// Input: one mode byte, then the payload. Modes below 0x80 hand the payload to every decoder,
// into a destination of the size it announces (capped; odd modes one element off, as a receiver
// whose wire header disagrees with the payload would). Modes >= 0x80 instead encode the bytes as
// floats, with topk (bits 5-6 of the mode 0 or 3), int8 (1) or int4 (2), and check that the
// decoder accepts its own encoder's output and that every decoded element is close to the
// original (or, for topk, zero).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "compression/codec.hpp"
#include "compression/quant.hpp"
#include "compression/topk.hpp"

namespace {

// A receiver sizes the destination from the wire header (bounded by core/wire.hpp); this
// harness keeps it below its memory limit.
constexpr uint64_t max_elements = uint64_t{1} << 22;

void round_trip_topk(uint8_t mode, const std::vector<float>& x) {
  const double ratio = ((mode & 0x0f) + 1) / 16.0;
  const auto values = static_cast<fusion::value_type>((mode >> 4) % 4);
  const uint32_t block = 1u + (mode & 0x03) * 7u;  // 1, 8, 15, 22: full and partial blocks
  std::vector<std::byte> payload;
  const uint32_t value_block = 1u + ((mode >> 2) & 0x03) * 3u;  // int8 values: 1, 4, 7, 10 per scale
  try {
    fusion::encode_topk(x, ratio, values, block, payload, value_block);
  } catch (const std::invalid_argument&) {
    // Refused: only int8 values of a tensor with an inf or NaN element.
    if (values != fusion::value_type::int8 || std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); }))
      std::abort();
    return;
  }
  std::vector<float> y(x.size(), 1.0f);
  if (!fusion::decode_topk(payload, y).ok()) std::abort();
  if (values == fusion::value_type::int8) {
    // Within half a step of the value run's scale, which is at most the block's absmax / 127.
    for (size_t b = 0; b * block < x.size(); ++b) {
      const size_t end = std::min(x.size(), (b + 1) * size_t{block});
      double absmax = 0;
      for (size_t i = b * block; i < end; ++i) absmax = std::max(absmax, std::fabs(double{x[i]}));
      for (size_t i = b * block; i < end; ++i)
        if (y[i] != 0.0f && std::fabs(double{y[i]} - x[i]) > absmax / 254 * (1 + 1e-5) + std::fabs(double{x[i]}) * 1e-6 + 1e-42)
          std::abort();
    }
    return;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f || std::isnan(x[i]) || std::isinf(y[i])) continue;
    // f16 and bf16 keep 8 and 11 significant bits; anything kept must be the original, rounded.
    if (std::fabs(y[i] - x[i]) > std::fabs(x[i]) / 64 + 1e-4f) std::abort();
  }
}

void round_trip_quant(uint8_t mode, unsigned bits, const std::vector<float>& x) {
  const uint32_t block = 1u + (mode & 0x0f) * 5u;  // 1..76: int4 bytes that straddle blocks
  std::vector<std::byte> payload;
  try {
    fusion::encode_quant(x, bits, block, payload);
  } catch (const std::invalid_argument&) {
    // Refused: only for an inf or NaN element.
    if (std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); })) std::abort();
    return;
  }
  std::vector<float> y(x.size(), 1.0f);
  if (!fusion::decode_quant(payload, y).ok()) std::abort();
  for (size_t b = 0; b * block < x.size(); ++b) {
    const size_t end = std::min(x.size(), (b + 1) * size_t{block});
    double absmax = 0;
    for (size_t i = b * block; i < end; ++i) absmax = std::max(absmax, std::fabs(double{x[i]}));
    const double step = absmax / (bits == 8 ? 127 : 7);
    // Half a step, plus fp32 rounding: relative for normal numbers, and absolute (a few units of
    // 2^-149) where the scale or the decoded value is subnormal.
    for (size_t i = b * block; i < end; ++i)
      if (std::fabs(double{y[i]} - x[i]) > step * 0.5 * (1 + 1e-5) + std::fabs(double{x[i]}) * 1e-6 + 1e-42)
        std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if (mode >= 0x80) {
    std::vector<float> x((size - 1) / sizeof(float));
    if (!x.empty()) std::memcpy(x.data(), data + 1, x.size() * sizeof(float));
    const unsigned which = (mode >> 5) & 3u;
    if (which == 1 || which == 2)
      round_trip_quant(mode, which == 1 ? 8 : 4, x);
    else
      round_trip_topk(mode, x);
    return 0;
  }
  uint64_t n = 0;
  if (!fusion::topk_payload_elements(payload, n) && !fusion::quant_payload_elements(payload, n))
    n = payload.size() / sizeof(float);
  if (mode & 1) ++n;
  if (n > max_elements) return 0;
  std::vector<float> dst(static_cast<size_t>(n));
  for (const fusion::codec* c : fusion::all_codecs())
    if (c->wire_encoding() == c->kind()) (void)c->decode(payload, dst);
  return 0;
}
