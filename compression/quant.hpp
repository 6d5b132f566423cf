// The quantizing edge codecs int8 and int4 (compression/codec.hpp has the interface; this is
// their format, for the codecs, their CUDA twin, their tests and the fuzzer). The flattened
// tensor is cut into blocks of `block` elements (the last block may be shorter); every block
// gets one f32 scale and every element one signed code:
//
//   scale_b = absmax_b / Q         absmax_b = max |x| of the block (an integer max of the bit
//                                  patterns with the sign cleared), Q = 127 (int8) or 7 (int4),
//                                  one correctly rounded fp32 division
//   code_i  = clamp(roundeven(x_i / scale_b), -Q, Q)   (0 for every element when scale_b is 0)
//   decoded = code_i * scale_b     (one fp32 multiply)
//
// so |x_i - decoded_i| <= scale_b / 2 up to fp32 rounding. -128 (int8) and -8 (int4) are never
// written. A block holding inf or NaN is refused by the encoder (std::invalid_argument naming
// the element): codes cannot carry them, and a run that produced one is broken anyway.
// Scales are f32, not f16: gradient blocks with absmax below ~8e-3 would get an f16 scale below
// f16's smallest normal (6.1e-5) and lose their precision, or flush to zero.
//
// Payload layout (little-endian), validated in full by decode_quant before anything is written:
//   [0,4)    magic "FZQ1"
//   [4]      bits per code: 8 or 4
//   [5]      scale type: 0 (f32; the only one)
//   [6,8)    reserved, zero
//   [8,16)   n: elements of the dense tensor
//   [16,20)  block: elements per scale, 1..65536
//   [20,24)  reserved, zero
//   [24, 24 + 4 * blocks)   the scales, blocks = ceil(n / block), f32, finite, >= +0
//   then the codes: int8: n bytes (two's complement, -127..127); int4: ceil(n / 2) bytes,
//   element 2j in the low nibble of byte j, element 2j+1 in its high nibble (two's complement,
//   -7..7); when n is odd the last high nibble is zero. Elements are packed across block
//   boundaries (a byte may hold the last element of one block and the first of the next).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compression/codec.hpp"

namespace fusion {

/// Bytes of the fixed quant payload header.
inline constexpr size_t quant_header_bytes = 24;

/// Elements per scale unless configured (compression.scale-block): chosen with
/// fusion-bench-codec (bench/RESULTS.md section 8), the reconstruction error and the bytes of
/// int8 and int4 at 32, 64, 128 and 256.
inline constexpr uint32_t quant_default_block = 64;

/// The levels of the int8 and int4 rungs of AdaTopK's ladder (compression/adaptive.hpp): the
/// doubles just below topk's keep_all_ratio (the f16 rung), so a larger level is always the
/// denser rung and every top-k ratio (<= 0.5) lies below them. adatopk at these levels is the
/// int8 / int4 codec, and int8 / int4 settings carry them as their keep_ratio.
inline constexpr double int8_level = 0x1.ffffffffffffep-1;
inline constexpr double int4_level = 0x1.ffffffffffffdp-1;

/// Exact payload bytes of an encoding of `n` elements with `bits` (8 or 4) per code and a scale
/// per `block` elements (saturates at UINT64_MAX).
uint64_t quant_payload_bytes(uint64_t n, unsigned bits, uint32_t block);

/// The implementations of the encoder; all write the same bytes (tests/compression/quant_test.cpp).
enum class quant_path : uint8_t { scalar = 0, avx2 = 1, avx512 = 2 };
std::string to_string(quant_path p);
/// The paths this CPU runs (scalar first), and the fastest of them (what encode_quant uses).
std::vector<quant_path> quant_paths();
quant_path quant_best_path();

/// Encodes `x` into `out` (resized to exactly quant_payload_bytes) on the fastest path. Throws
/// std::invalid_argument on bits other than 8 and 4, a block outside 1..codec_max_block, or an
/// element that is inf or NaN (the message names it and its block).
void encode_quant(std::span<const float> x, unsigned bits, uint32_t block, std::vector<std::byte>& out);
/// encode_quant on a chosen path; std::invalid_argument when it is not one of quant_paths().
void encode_quant(std::span<const float> x, unsigned bits, uint32_t block, std::vector<std::byte>& out,
                  quant_path path);

/// The encoders' refusal of element `element` (of value `value`, inf or NaN) in a tensor cut
/// into blocks of `block`: every path and the CUDA encoder say the same.
std::string quant_non_finite_message(unsigned bits, uint64_t element, float value, uint32_t block);

/// Decodes a quant payload into `dst` (dst.size() must equal the payload's n). Validates the
/// whole payload first (magic, bits, scale type, reserved bytes, block, exact length, every
/// scale finite and not negative, no code -128 / -8, the padding nibble zero); on any error fails
/// saying what is wrong and leaves `dst` untouched.
status decode_quant(std::span<const std::byte> payload, std::span<float> dst);

/// Reads n from a payload header without validating the rest. False when shorter than the
/// header or the magic is wrong.
bool quant_payload_elements(std::span<const std::byte> payload, uint64_t& n);

/// The int8 rules on a bare array, for codecs that carry int8 values inside their own payloads
/// (topk's int8 value type, compression/topk.hpp): `scales` holds ceil(n / block) f32 scales,
/// `codes` n int8 codes, laid out as in an int8 payload after its header.
namespace quant_detail {
/// Writes the scales and codes of `n` floats on the fastest path; returns the start of the first
/// block holding inf or NaN (nothing from it on is written), or n when every element is finite.
uint64_t quantize_int8(const float* x, uint64_t n, uint32_t block, std::byte* scales, int8_t* codes);
/// What is wrong with the scales and codes ("the scale of value block 3 is NaN"), "" when sound.
std::string check_int8(const std::byte* scales, const std::byte* codes, uint64_t n, uint32_t block);
/// Decodes checked scales and codes into dst[0, n).
void dequantize_int8(const std::byte* scales, const std::byte* codes, uint64_t n, uint32_t block, float* dst);
}  // namespace quant_detail

}  // namespace fusion
