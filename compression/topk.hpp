// The topk edge codec (compression/codec.hpp has the interface; this is its format, for the
// codec itself, its CUDA twin, its tests and the fuzzer): magnitude top-k per block of the
// flattened tensor: in every block of `block` elements (the last block may be shorter) exactly
// k_b = keep_count(len_b, ratio) elements with the largest |x| are kept, ties broken towards
// the lower index; the rest decode as zero. Positions travel as block-local 16-bit indices or
// as a bitmap, whichever is smaller for k_b; values as fp32, fp16 or bf16, or as int8 codes with
// an f32 scale per `value block` kept values (the int8 codec's rules, compression/quant.hpp:
// scale = absmax / 127 of those values, code = roundeven(v / scale); a tensor holding inf or NaN
// is refused with int8 values, as the int8 codec refuses it).
//
// Payload layout (little-endian), validated in full by decode_topk before anything is
// written:
//   [0,4)   magic "FZK1"
//   [4]     value_type (0 f32, 1 f16, 2 bf16, 3 int8)
//   [5]     index form (0 u16 indices, 1 bitmap)
//   [6,8)   reserved, zero
//   [8,16)  n: elements of the dense tensor
//   [16,20) block: elements per block, 1..65536
//   [20,24) k_full: kept per full block (<= block)
//   [24,28) k_tail: kept in the last, partial block (0 when n % block == 0)
//   [28,32) int8 values: the value block, kept values per scale, 1..65536; else zero
//   then per block, in order: its positions (k_b u16 block-local indices, ascending; or a
//   bitmap of ceil(len_b / 8) bytes, bit i of byte j = element 8j+i), then its k_b values in
//   ascending position order: k_b f32 / f16 / bf16 values, or for int8 ceil(k_b / value block)
//   f32 scales (finite, >= +0) followed by k_b int8 codes (-127..127). Value blocks restart in
//   every block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compression/codec.hpp"
#include "compression/quant.hpp"  // quant_default_block: int8 values' scale block

namespace fusion {

/// Bytes of the fixed payload header.
inline constexpr size_t codec_header_bytes = 32;

/// The ratio that keeps every element but sends the values rounded to the value type: the
/// largest double below 1, for which keep_count keeps whole blocks (ratio 1 means raw fp32).
inline constexpr double keep_all_ratio = 0x1.fffffffffffffp-1;

/// Kept elements in a block of `len` elements at `ratio`: ceil(ratio * len), at least 1 when
/// len > 0, at most len.
uint32_t keep_count(uint32_t len, double ratio);

/// Exact payload bytes of a topk encoding of `n` elements with these settings (what
/// encode_topk writes; `value_block` counts only for int8 values). The scheduler inverts it to
/// pick a ratio for a byte budget.
uint64_t topk_payload_bytes(uint64_t n, double ratio, value_type values, uint32_t block,
                            uint32_t value_block = quant_default_block);

/// Upper bound of a valid topk payload for `n` elements, any ratio and value type (decoders
/// refuse anything announced larger before allocating).
uint64_t topk_max_payload_bytes(uint64_t n);

/// Encodes `x` into `out` (resized to exactly topk_payload_bytes). O(n): per block a selection
/// of the threshold, then one pass. Throws std::invalid_argument on a ratio outside (0, 1], a
/// block or value block outside 1..codec_max_block, or (int8 values) an element that is inf or
/// NaN (topk_non_finite_message).
void encode_topk(std::span<const float> x, double ratio, value_type values, uint32_t block,
                 std::vector<std::byte>& out, uint32_t value_block = quant_default_block);

/// The refusal of element `element` (inf or NaN, of value `value`) under int8 values: the CPU
/// and the CUDA encoder say the same.
std::string topk_non_finite_message(uint64_t element, float value, uint32_t block);

/// Decodes a topk payload into `dst` (dst.size() must equal the payload's n): zeros, then the
/// kept values at their positions. Validates the whole payload first (magic, sizes, k <= block,
/// indices ascending and inside their block, bitmap popcounts, exact length); on any error
/// fails saying what is wrong and leaves `dst` untouched.
status decode_topk(std::span<const std::byte> payload, std::span<float> dst);

/// Reads n from a payload header without validating the rest (the receiver sizes the dense
/// tensor from the wire header and checks it against this). False when shorter than the header
/// or the magic is wrong.
bool topk_payload_elements(std::span<const std::byte> payload, uint64_t& n);

}  // namespace fusion
