// Fuzzes the compression payload decoder (compression/topk.hpp decode_topk and
// topk_payload_elements): header, block sizes, kept counts, u16 index lists and bitmaps, f32,
// f16 and bf16 values, exact length.
//
// Input: one mode byte, then the payload. Even modes decode the payload into a destination of
// the size it announces (capped), odd ones into a destination one element off, as a receiver
// whose wire header disagrees with the payload would. Mode >= 0x80 instead encodes the bytes as
// floats with encode_topk and checks that the decoder accepts its own encoder's output and that
// every decoded element is zero or (close to) the original.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "compression/topk.hpp"

namespace {

// A receiver sizes the destination from the wire header (bounded by core/wire.hpp); this
// harness keeps it below its memory limit.
constexpr uint64_t max_elements = uint64_t{1} << 22;

void round_trip(uint8_t mode, const uint8_t* data, size_t size) {
  std::vector<float> x(size / sizeof(float));
  if (!x.empty()) std::memcpy(x.data(), data, x.size() * sizeof(float));
  const double ratio = ((mode & 0x0f) + 1) / 16.0;
  const auto values = static_cast<fusion::value_type>((mode >> 4) % 3);
  const uint32_t block = 1u + (mode & 0x03) * 7u;  // 1, 8, 15, 22: full and partial blocks
  std::vector<std::byte> payload;
  fusion::encode_topk(x, ratio, values, block, payload);
  std::vector<float> y(x.size(), 1.0f);
  if (!fusion::decode_topk(payload, y).ok()) std::abort();
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f || std::isnan(x[i]) || std::isinf(y[i])) continue;
    // f16 and bf16 keep 8 and 11 significant bits; anything kept must be the original, rounded.
    if (std::fabs(y[i] - x[i]) > std::fabs(x[i]) / 64 + 1e-4f) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if (mode >= 0x80) {
    round_trip(mode, data + 1, size - 1);
    return 0;
  }
  uint64_t n = 0;
  if (!fusion::topk_payload_elements(payload, n)) n = payload.size();
  if (mode & 1) ++n;
  if (n > max_elements) return 0;
  std::vector<float> dst(static_cast<size_t>(n));
  (void)fusion::decode_topk(payload, dst);
  return 0;
}
