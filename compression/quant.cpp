// The int8 and int4 edge codecs on the CPU (format and rules in compression/quant.hpp). Three
// encoder paths write the same bytes: a scalar reference, AVX2 and AVX-512 (compiled with
// target attributes whatever the build's -march, chosen at run time with
// __builtin_cpu_supports). They agree because every step is exactly rounded the same way on
// each: an integer max for absmax, one IEEE division for the scale and one per element, round
// to nearest even with an explicit rounding mode, and an exact conversion of an integral value.
#include "compression/quant.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
// GCC 12's AVX-512 headers warn about their own _mm512_undefined_* placeholders when used from a
// target("avx512f") function (GCC bug 105593, fixed in GCC 13); the warnings point into the
// header, so they are silenced for its lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "compression/payload_bytes.hpp"

namespace fusion {

static_assert(std::endian::native == std::endian::little, "the codec stores little-endian with memcpy");
static_assert(codec_settings{}.scale_block == quant_default_block, "codec_settings' default scale block");

namespace {

using payload_bytes::load;
using payload_bytes::sat_add;
using payload_bytes::sat_mul;
using payload_bytes::store;

constexpr uint32_t abs_mask = 0x7fffffffu, inf_bits = 0x7f800000u;


float qmax_of(unsigned bits) { return bits == 8 ? 127.0f : 7.0f; }

// absmax / Q, one step lower where the division rounded up so far that Q * scale overflows: an
// absmax near FLT_MAX must decode to a finite value (found by fuzz_codec). The GPU encoder does
// the same (compression/cuda/quant.cu).
float scale_of(float absmax, float qmax) {
  const float scale = absmax / qmax;
  return std::isinf(scale * qmax) ? std::nextafter(scale, 0.0f) : scale;
}
uint64_t code_bytes(uint64_t n, unsigned bits) { return bits == 8 ? n : n / 2 + n % 2; }
uint64_t block_count(uint64_t n, uint32_t block) { return n / block + (n % block ? 1 : 0); }

// ---- the per-block kernels of each path ------------------------------------------------------

// Round to nearest, ties to even. Clang before 15 lacks the builtin; nearbyint does the same
// under the default rounding mode, which nothing in the project changes.
inline float round_even(float v) {
#if defined(__has_builtin) && __has_builtin(__builtin_roundevenf)
  return __builtin_roundevenf(v);
#else
  return std::nearbyint(v);
#endif
}

// One element: the reference every path reproduces.
inline int8_t quantize_one(float x, float scale, float qmax) {
  const float q = round_even(x / scale);
  return static_cast<int8_t>(static_cast<int>(std::min(std::max(q, -qmax), qmax)));
}

uint32_t max_abs_bits_scalar(const float* x, uint32_t len) {
  uint32_t m = 0;
  for (uint32_t j = 0; j < len; ++j) m = std::max(m, std::bit_cast<uint32_t>(x[j]) & abs_mask);
  return m;
}

void quantize_scalar(const float* x, uint32_t len, float scale, float qmax, int8_t* q) {
  for (uint32_t j = 0; j < len; ++j) q[j] = quantize_one(x[j], scale, qmax);
}

#define FUSION_AVX2 __attribute__((target("avx2")))
#define FUSION_AVX512 __attribute__((target("avx512f")))

FUSION_AVX2 uint32_t max_abs_bits_avx2(const float* x, uint32_t len) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(abs_mask));
  __m256i m = _mm256_setzero_si256();
  uint32_t j = 0;
  for (; j + 8 <= len; j += 8)
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)), mask));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  uint32_t r = 0;
  for (uint32_t v : lanes) r = std::max(r, v);
  return std::max(r, max_abs_bits_scalar(x + j, len - j));
}

FUSION_AVX2 inline __m256i quantize8_avx2(const float* x, __m256 scale, __m256 lo, __m256 hi) {
  __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));  // integral: exact
}

FUSION_AVX2 void quantize_avx2(const float* x, uint32_t len, float scale, float qmax, int8_t* q) {
  const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
  // packs works per 128-bit lane: the dwords come out as a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 ...
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  uint32_t j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i ab = _mm256_packs_epi32(quantize8_avx2(x + j, s, lo, hi), quantize8_avx2(x + j + 8, s, lo, hi));
    const __m256i cd = _mm256_packs_epi32(quantize8_avx2(x + j + 16, s, lo, hi), quantize8_avx2(x + j + 24, s, lo, hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j),
                        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order));
  }
  quantize_scalar(x + j, len - j, scale, qmax, q + j);
}

FUSION_AVX512 uint32_t max_abs_bits_avx512(const float* x, uint32_t len) {
  const __m512i mask = _mm512_set1_epi32(static_cast<int>(abs_mask));
  __m512i m = _mm512_setzero_si512();
  uint32_t j = 0;
  for (; j + 16 <= len; j += 16) m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + j), mask));
  return std::max(_mm512_reduce_max_epu32(m), max_abs_bits_scalar(x + j, len - j));
}

FUSION_AVX512 void quantize_avx512(const float* x, uint32_t len, float scale, float qmax, int8_t* q) {
  const __m512 s = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-qmax), hi = _mm512_set1_ps(qmax);
  uint32_t j = 0;
  for (; j + 16 <= len; j += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + j), s),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  quantize_scalar(x + j, len - j, scale, qmax, q + j);
}

struct kernels {
  uint32_t (*max_abs_bits)(const float*, uint32_t);
  void (*quantize)(const float*, uint32_t, float, float, int8_t*);
};

kernels kernels_of(quant_path p) {
  switch (p) {
    case quant_path::avx2: return {&max_abs_bits_avx2, &quantize_avx2};
    case quant_path::avx512: return {&max_abs_bits_avx512, &quantize_avx512};
    case quant_path::scalar: break;
  }
  return {&max_abs_bits_scalar, &quantize_scalar};
}

// ---- encoder -----------------------------------------------------------------------------------


std::string codec_name(unsigned bits) { return bits == 8 ? "int8" : "int4"; }

[[noreturn]] void refuse_non_finite(const float* x, uint64_t start, uint32_t len, uint32_t block, unsigned bits) {
  for (uint32_t j = 0; j < len; ++j)
    if (!std::isfinite(x[start + j]))
      throw std::invalid_argument(quant_non_finite_message(bits, start + j, x[start + j], block));
  throw std::logic_error(codec_name(bits) + ": absmax is not finite but every element is");
}

// Packs int8 codes (-7..7) two per byte, element 2j in the low nibble.
void pack_nibbles(const int8_t* q, uint64_t n, std::byte* out) {
  const uint64_t pairs = n / 2;
  auto* o = reinterpret_cast<uint8_t*>(out);
  for (uint64_t j = 0; j < pairs; ++j)
    o[j] = static_cast<uint8_t>((static_cast<uint8_t>(q[2 * j]) & 0x0fu) | (static_cast<uint8_t>(q[2 * j + 1]) << 4));
  if (n % 2) o[pairs] = static_cast<uint8_t>(static_cast<uint8_t>(q[n - 1]) & 0x0fu);
}

// Scales and codes of every block of x (codes -Q..Q as int8, one per element); returns the start
// of the first block holding inf or NaN (nothing after it is written), or n.
uint64_t quantize_blocks(const float* x, uint64_t n, uint32_t block, float qmax, const kernels& k, std::byte* scales,
                         int8_t* q) {
  for (uint64_t b = 0, blocks = block_count(n, block); b < blocks; ++b) {
    const uint64_t start = b * block;
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(block, n - start));
    const uint32_t m = k.max_abs_bits(x + start, len);
    if (m >= inf_bits) return start;
    const float scale = scale_of(std::bit_cast<float>(m), qmax);
    store<float>(scales + b * sizeof(float), scale);
    if (scale == 0)  // all zero, or an absmax so small that its scale underflows
      std::memset(q + start, 0, len);
    else
      k.quantize(x + start, len, scale, qmax, q + start);
  }
  return n;
}

// The first scale that is negative, infinite or NaN, as words ("" when all are sound).
std::string bad_scale(const std::byte* scales, uint64_t blocks, uint64_t& which) {
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint32_t s = load<uint32_t>(scales + b * sizeof(float));
    if (s >= inf_bits)  // the sign bit, an infinity or a NaN
      return which = b, (s & 0x80000000u ? "negative" : (s == inf_bits ? "infinite" : "NaN"));
  }
  return "";
}

}  // namespace

std::string quant_non_finite_message(unsigned bits, uint64_t element, float value, uint32_t block) {
  return codec_name(bits) + ": element " + std::to_string(element) + " of the tensor is " +
         (std::isnan(value) ? "NaN" : "infinite") + " (block " + std::to_string(element / block) +
         "): a quantizing codec carries finite values only";
}

std::string to_string(quant_path p) {
  switch (p) {
    case quant_path::scalar: return "scalar";
    case quant_path::avx2: return "avx2";
    case quant_path::avx512: return "avx512";
  }
  return "quant_path(" + std::to_string(static_cast<int>(p)) + ")";
}

std::vector<quant_path> quant_paths() {
  std::vector<quant_path> out = {quant_path::scalar};
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) out.push_back(quant_path::avx2);
  if (__builtin_cpu_supports("avx512f")) out.push_back(quant_path::avx512);
  return out;
}

quant_path quant_best_path() {
  static const quant_path best = quant_paths().back();
  return best;
}

uint64_t quant_payload_bytes(uint64_t n, unsigned bits, uint32_t block) {
  block = std::clamp<uint32_t>(block, 1, codec_max_block);
  return sat_add(sat_add(quant_header_bytes, sat_mul(block_count(n, block), sizeof(float))), code_bytes(n, bits));
}

void encode_quant(std::span<const float> x, unsigned bits, uint32_t block, std::vector<std::byte>& out) {
  encode_quant(x, bits, block, out, quant_best_path());
}

void encode_quant(std::span<const float> x, unsigned bits, uint32_t block, std::vector<std::byte>& out,
                  quant_path path) {
  if (bits != 8 && bits != 4) throw std::invalid_argument("quant: " + std::to_string(bits) + " bits per code (8 or 4)");
  if (block < 1 || block > codec_max_block)
    throw std::invalid_argument(codec_name(bits) + ": block of " + std::to_string(block) + " elements (1.." +
                                std::to_string(codec_max_block) + ")");
  static const std::vector<quant_path> runnable = quant_paths();
  if (std::find(runnable.begin(), runnable.end(), path) == runnable.end())
    throw std::invalid_argument(codec_name(bits) + ": this CPU cannot run the " + to_string(path) + " path");
  const uint64_t n = x.size(), blocks = block_count(n, block);
  out.resize(quant_payload_bytes(n, bits, block));
  std::byte* p = out.data();
  std::memcpy(p, "FZQ1", 4);
  p[4] = static_cast<std::byte>(bits);
  p[5] = std::byte{0};
  store<uint16_t>(p + 6, 0);
  store<uint64_t>(p + 8, n);
  store<uint32_t>(p + 16, block);
  store<uint32_t>(p + 20, 0);
  std::byte* scales = p + quant_header_bytes;
  std::byte* codes = scales + blocks * sizeof(float);
  // int8 codes go straight into the payload; int4 codes are packed at the end, as a byte may
  // hold elements of two blocks.
  thread_local std::vector<int8_t> scratch;
  if (bits == 4) scratch.resize(n);
  int8_t* q = bits == 8 ? reinterpret_cast<int8_t*>(codes) : scratch.data();
  const uint64_t bad = quantize_blocks(x.data(), n, block, qmax_of(bits), kernels_of(path), scales, q);
  if (bad < n) refuse_non_finite(x.data(), bad, static_cast<uint32_t>(std::min<uint64_t>(block, n - bad)), block, bits);
  if (bits == 4) pack_nibbles(q, n, codes);
}

namespace {

struct quant_layout {
  uint64_t n = 0, blocks = 0, total = 0;
  uint32_t block = 1;
  unsigned bits = 8;
  size_t codes_offset() const { return quant_header_bytes + blocks * sizeof(float); }
};

result<quant_layout> read_quant_header(std::span<const std::byte> payload, unsigned want_bits) {
  const std::string what = (want_bits ? codec_name(want_bits) : std::string("quant")) + " payload: ";
  if (payload.size() < quant_header_bytes)
    return fail(what + std::to_string(payload.size()) + " bytes, shorter than the 24-byte header");
  const std::byte* p = payload.data();
  if (std::memcmp(p, "FZQ1", 4) != 0) return fail(what + "bad magic (not FZQ1)");
  quant_layout l;
  l.bits = static_cast<uint8_t>(p[4]);
  if (l.bits != 8 && l.bits != 4) return fail(what + std::to_string(l.bits) + " bits per code (8 or 4)");
  if (want_bits && l.bits != want_bits)
    return fail(what + "carries " + std::to_string(l.bits) + "-bit codes, not " + std::to_string(want_bits));
  if (static_cast<uint8_t>(p[5]) != 0)
    return fail(what + "unknown scale type " + std::to_string(static_cast<uint8_t>(p[5])) + " (0 f32)");
  if (load<uint16_t>(p + 6) != 0 || load<uint32_t>(p + 20) != 0)
    return fail(what + "reserved header bytes are not zero");
  l.n = load<uint64_t>(p + 8);
  l.block = load<uint32_t>(p + 16);
  if (l.block < 1 || l.block > codec_max_block)
    return fail(what + "block of " + std::to_string(l.block) + " elements (1.." + std::to_string(codec_max_block) +
                ")");
  l.blocks = block_count(l.n, l.block);
  l.total = quant_payload_bytes(l.n, l.bits, l.block);
  if (l.total != payload.size())
    return fail(what + std::to_string(payload.size()) + " bytes, the header implies " +
                (l.total == UINT64_MAX ? std::string("more than 2^64") : std::to_string(l.total)) + " (n " +
                std::to_string(l.n) + ", " + std::to_string(l.bits) + "-bit codes, a scale per " +
                std::to_string(l.block) + " elements)");
  return l;
}

// Every scale finite and not negative, no code the encoder never writes, padding zero.
status check_quant_body(const quant_layout& l, const std::byte* p, const std::string& what) {
  uint64_t b = 0;
  if (const std::string bad = bad_scale(p + quant_header_bytes, l.blocks, b); !bad.empty())
    return fail(what + "the scale of block " + std::to_string(b) + " is " + bad);
  const auto* c = reinterpret_cast<const uint8_t*>(p + l.codes_offset());
  const uint64_t bytes = code_bytes(l.n, l.bits);
  bool bad = false;  // a branch-free scan first; the slow one only to name the culprit
  if (l.bits == 8)
    for (uint64_t j = 0; j < bytes; ++j) bad |= c[j] == 0x80u;
  else
    for (uint64_t j = 0; j < bytes; ++j) bad |= ((c[j] & 0x0fu) == 0x08u) | ((c[j] & 0xf0u) == 0x80u);
  if (l.bits == 4 && l.n % 2 && (c[bytes - 1] >> 4) != 0)
    return fail(what + "the padding nibble after the last element is not zero");
  if (!bad) return {};
  for (uint64_t i = 0; i < l.n; ++i) {
    const bool never = l.bits == 8 ? c[i] == 0x80u : ((c[i / 2] >> (4 * (i % 2))) & 0x0fu) == 0x08u;
    if (never)
      return fail(what + "element " + std::to_string(i) + " has the code " + (l.bits == 8 ? "-128" : "-8") +
                  ", which no encoder writes (codes are -" + (l.bits == 8 ? "127..127)" : "7..7)"));
  }
  return {};
}

void decode_checked(const quant_layout& l, const std::byte* p, float* dst) {
  const std::byte* scales = p + quant_header_bytes;
  const auto* c = reinterpret_cast<const uint8_t*>(p + l.codes_offset());
  for (uint64_t b = 0; b < l.blocks; ++b) {
    const float s = load<float>(scales + b * sizeof(float));
    const uint64_t start = b * l.block, end = std::min<uint64_t>(start + l.block, l.n);
    if (l.bits == 8) {
      const auto* q = reinterpret_cast<const int8_t*>(c);
      for (uint64_t i = start; i < end; ++i) dst[i] = static_cast<float>(q[i]) * s;
      continue;
    }
    auto nibble = [&](uint64_t i) {  // sign-extended 4-bit code of element i
      return static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(c[i / 2] >> (4 * (i % 2))) << 4) >> 4);
    };
    uint64_t i = start;
    if (i % 2 && i < end) dst[i] = nibble(i) * s, ++i;
    for (; i + 2 <= end; i += 2) {
      const uint8_t byte = c[i / 2];
      dst[i] = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(byte << 4)) >> 4) * s;
      dst[i + 1] = static_cast<float>(static_cast<int8_t>(byte) >> 4) * s;
    }
    if (i < end) dst[i] = nibble(i) * s;
  }
}

status decode_quant_bits(std::span<const std::byte> payload, std::span<float> dst, unsigned want_bits) {
  auto header = read_quant_header(payload, want_bits);
  if (!header) return header.failed();
  const quant_layout& l = *header;
  const std::string what = codec_name(l.bits) + " payload: ";
  if (l.n != dst.size())
    return fail(what + "carries " + std::to_string(l.n) + " elements, the destination holds " +
                std::to_string(dst.size()));
  if (auto sound = check_quant_body(l, payload.data(), what); !sound) return sound;
  decode_checked(l, payload.data(), dst.data());
  return {};
}

}  // namespace

status decode_quant(std::span<const std::byte> payload, std::span<float> dst) {
  return decode_quant_bits(payload, dst, 0);
}

namespace quant_detail {

uint64_t quantize_int8(const float* x, uint64_t n, uint32_t block, std::byte* scales, int8_t* codes) {
  return quantize_blocks(x, n, block, qmax_of(8), kernels_of(quant_best_path()), scales, codes);
}

std::string check_int8(const std::byte* scales, const std::byte* codes, uint64_t n, uint32_t block) {
  uint64_t b = 0;
  if (std::string bad = bad_scale(scales, block_count(n, block), b); !bad.empty())
    return "the scale of value block " + std::to_string(b) + " is " + bad;
  const auto* c = reinterpret_cast<const uint8_t*>(codes);
  bool never = false;
  for (uint64_t j = 0; j < n; ++j) never |= c[j] == 0x80u;
  if (!never) return "";
  for (uint64_t j = 0; j < n; ++j)
    if (c[j] == 0x80u) return "value " + std::to_string(j) + " has the code -128, which no encoder writes";
  return "";
}

void dequantize_int8(const std::byte* scales, const std::byte* codes, uint64_t n, uint32_t block, float* dst) {
  const auto* q = reinterpret_cast<const int8_t*>(codes);
  for (uint64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(q[j]) * load<float>(scales + (j / block) * sizeof(float));
}

}  // namespace quant_detail

bool quant_payload_elements(std::span<const std::byte> payload, uint64_t& n) {
  return payload_bytes::elements(payload, "FZQ1", quant_header_bytes, n);
}

namespace {

// int8 and int4: the same format with 8- or 4-bit codes.
class quant_codec_impl final : public codec {
 public:
  explicit quant_codec_impl(unsigned bits) : bits_(bits) {}
  codec_kind kind() const override { return bits_ == 8 ? codec_kind::int8 : codec_kind::int4; }

  codec_settings at(double, const codec_settings& run) const override {
    // No level of its own: keep_ratio holds the rung's place on AdaTopK's ladder, so a governor
    // started from these settings resumes at this rung (compression/adaptive.hpp).
    codec_settings s = run;
    s.kind = kind();
    s.keep_ratio = bits_ == 8 ? int8_level : int4_level;
    return s;
  }
  bool encodes(uint64_t n, const codec_settings& s) const override {
    return payload_bytes(n, s) < sat_mul(n, sizeof(float));
  }
  uint64_t payload_bytes(uint64_t n, const codec_settings& s) const override {
    return quant_payload_bytes(n, bits_, s.scale_block);
  }
  payload_range payload_limits(uint64_t n) const override {
    return {quant_payload_bytes(n, bits_, codec_max_block), quant_payload_bytes(n, bits_, 1)};
  }
  void encode(std::span<const float> x, const codec_settings& s, std::vector<std::byte>& out) const override {
    encode_quant(x, bits_, s.scale_block, out);
  }
  status decode(std::span<const std::byte> payload, std::span<float> dst) const override {
    return decode_quant_bits(payload, dst, bits_);
  }
  std::string describe(const codec_settings& s) const override {
    return name() + " /" + std::to_string(s.scale_block) + (s.error_feedback ? " ef" : "");
  }
  std::vector<codec_settings> examples() const override {
    std::vector<codec_settings> out;
    for (const uint32_t block : {1u, 7u, 64u, 256u, codec_max_block}) {
      codec_settings s = at(1.0, {});
      s.scale_block = block;
      out.push_back(s);
    }
    return out;
  }
  double error_bound(const codec_settings& s) const override {
    // Per element |error| <= min(|x|, absmax_b / 2Q), and absmax_b <= ||x_b||: so the squared
    // error of a block is at most B (||x_b|| / 2Q)^2, and never above ||x_b||^2.
    const double per_block = std::sqrt(static_cast<double>(std::clamp<uint32_t>(s.scale_block, 1, codec_max_block))) /
                             (2.0 * qmax_of(bits_));
    return std::min(1.0, per_block) * (1 + 1e-5) + 1e-6;
  }

 private:
  unsigned bits_;
};

}  // namespace

const codec& int8_codec() {
  static const quant_codec_impl c(8);
  return c;
}

const codec& int4_codec() {
  static const quant_codec_impl c(4);
  return c;
}

}  // namespace fusion
