// The topk edge codec on the CPU (layout in compression/topk.hpp). The rules, which any other
// implementation (compression/cuda/) must follow to produce the same bytes:
//
//  keep count   k_b = keep_count(len_b, ratio): ceil(ratio * len_b) computed in double with a
//               relative tolerance of 1e-12 (so 0.07 of 100 keeps 7, although 0.07 * 100 is
//               7.000000000000001 in binary), then clamped to [1, len_b]; 0 for an empty block.
//  selection    per block, the key of x[i] is its fp32 bit pattern with the sign bit cleared,
//               compared as an unsigned integer (for non-NaN values this is |x| order; +0 and
//               -0 tie). T = the k_b-th largest key. Kept: every element with key > T, then the
//               elements with key == T in ascending index order until k_b are kept.
//  NaN          no special case: a NaN's key (0x7f800001..0x7fffffff) ranks above +inf, so NaNs
//               are kept first (a NaN gradient travels like a dense one would), NaNs among
//               themselves by payload bits, then index.
//  values       the kept x[i] in ascending index order, as fp32 bits, or rounded to fp16 / bf16
//               to nearest, ties to even, subnormals kept, overflow to inf, NaN quieted with its
//               payload truncated (compression/half.hpp has the exact bit recipes); or int8:
//               the int8 codec's scales and codes of the block's kept values in runs of the
//               value block (compression/quant.cpp's kernels). With int8 values a tensor with
//               any inf or NaN is refused, naming the lowest such element: one always ranks
//               among its block's kept values, and codes cannot carry it.
//  index form   u16 indices if 2 * (full * k_full + k_tail) <= full * ceil(block / 8) +
//               ceil(tail / 8) (the positions of the whole payload; ties go to indices), else
//               bitmaps. full = n / block, tail = n % block.
//  header       k_full = keep_count(block, ratio) even when there is no full block (n < block);
//               k_tail = keep_count(tail, ratio), 0 without a partial block. n = 0 encodes as a
//               bare 32-byte header.
//
// The decoder accepts any payload that is consistent in itself (either index form, any
// k_full <= block and k_tail <= tail, k = 0 included): it checks structure, not encoder choices.
#include "compression/topk.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "compression/half.hpp"
#include "compression/quant.hpp"
#include "compression/payload_bytes.hpp"
#include "compression/select.hpp"

namespace fusion {

static_assert(std::endian::native == std::endian::little, "the codec stores little-endian with memcpy");

uint32_t keep_count(uint32_t len, double ratio) {
  if (len == 0) return 0;
  if (!(ratio > 0)) return 1;  // NaN too
  if (ratio >= 1) return len;
  const double want = std::ceil(ratio * len - 1e-12 * len);
  return want <= 1 ? 1 : (want >= len ? len : static_cast<uint32_t>(want));
}

namespace {

using payload_bytes::load;
using payload_bytes::sat_add;
using payload_bytes::sat_mul;
using payload_bytes::saturated;
using payload_bytes::store;


uint32_t value_bytes(value_type v) { return v == value_type::f32 ? 4 : (v == value_type::int8 ? 1 : 2); }

// Sizes and offsets of one payload. total saturates at UINT64_MAX (no payload is that long).
struct layout {
  uint64_t n = 0, full = 0;  // elements, full blocks
  uint32_t block = 1, tail = 0, k_full = 0, k_tail = 0;
  value_type values = value_type::f32;
  uint32_t vblock = 0;       // int8 values: kept values per scale; else 0
  bool bitmap = false;
  uint64_t full_bytes = 0, total = 0;  // one full block's section; the whole payload

  uint32_t pos_bytes(uint32_t len, uint32_t k) const { return bitmap ? (len + 7) / 8 : 2 * k; }
  uint64_t scales(uint32_t k) const { return vblock ? (uint64_t{k} + vblock - 1) / vblock : 0; }
  uint64_t vals_bytes(uint32_t k) const { return 4 * scales(k) + uint64_t{k} * value_bytes(values); }
  void size() {
    full = n / block;
    tail = static_cast<uint32_t>(n % block);
    full_bytes = pos_bytes(block, k_full) + vals_bytes(k_full);
    const uint64_t tail_bytes = tail ? pos_bytes(tail, k_tail) + vals_bytes(k_tail) : 0;
    total = sat_add(sat_add(codec_header_bytes, sat_mul(full, full_bytes)), tail_bytes);
  }
  uint64_t offset(uint64_t b) const { return codec_header_bytes + b * full_bytes; }
  uint32_t len(uint64_t b) const { return b < full ? block : tail; }
  uint32_t kept(uint64_t b) const { return b < full ? k_full : k_tail; }
  uint64_t blocks() const { return full + (tail ? 1 : 0); }
};

uint32_t clamp_block(uint32_t block) { return std::clamp<uint32_t>(block, 1, codec_max_block); }

// The encoder's layout: keep counts from the ratio, the smaller index form.
layout plan(uint64_t n, double ratio, value_type values, uint32_t block, uint32_t value_block) {
  layout l;
  l.n = n;
  l.block = clamp_block(block);
  l.values = values;
  l.vblock = values == value_type::int8 ? clamp_block(value_block) : 0;
  const uint64_t full = n / l.block;
  const uint32_t tail = static_cast<uint32_t>(n % l.block);
  l.k_full = keep_count(l.block, ratio);
  l.k_tail = keep_count(tail, ratio);
  const uint64_t index_bytes = sat_mul(2, sat_add(sat_mul(full, l.k_full), l.k_tail));
  const uint64_t bitmap_bytes = sat_add(sat_mul(full, (l.block + 7) / 8), (tail + 7) / 8);
  l.bitmap = index_bytes > bitmap_bytes;
  l.size();
  return l;
}


// Converts values to the payload's type (loops stay branch-free so they vectorise).
void write_values(std::byte* p, const float* v, uint32_t k, const layout& l, uint16_t* tmp) {
  const value_type t = l.values;
  if (t == value_type::int8) {
    // The tensor was checked finite, so every run of values gets its scale.
    if (quant_detail::quantize_int8(v, k, l.vblock, p, reinterpret_cast<int8_t*>(p + 4 * l.scales(k))) != k)
      throw std::logic_error("topk: a kept value is not finite in a tensor checked finite");
    return;
  }
  if (t == value_type::f32) {
    std::memcpy(p, v, size_t{k} * 4);
    return;
  }
  if (t == value_type::f16) {
    uint32_t j = 0;
    // The hardware conversion rounds exactly like f32_to_f16_bits, NaNs included (the tests
    // compare the two); it is one instruction per vector.
#if defined(__AVX512F__)
    for (; j + 16 <= k; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp + j),
                          _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; j + 8 <= k; j += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp + j),
                       _mm256_cvtps_ph(_mm256_loadu_ps(v + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; j < k; ++j) tmp[j] = f32_to_f16_bits(v[j]);
  } else {
    for (uint32_t j = 0; j < k; ++j) tmp[j] = f32_to_bf16_bits(v[j]);
  }
  std::memcpy(p, tmp, size_t{k} * 2);
}

void read_values(const std::byte* p, uint32_t k, const layout& l, float* v, uint16_t* tmp) {
  const value_type t = l.values;
  if (t == value_type::int8) {
    quant_detail::dequantize_int8(p, p + 4 * l.scales(k), k, l.vblock, v);
    return;
  }
  if (t == value_type::f32) {
    std::memcpy(v, p, size_t{k} * 4);
    return;
  }
  std::memcpy(tmp, p, size_t{k} * 2);
  if (t == value_type::f16)
    for (uint32_t j = 0; j < k; ++j) v[j] = f16_bits_to_f32(tmp[j]);
  else
    for (uint32_t j = 0; j < k; ++j) v[j] = bf16_bits_to_f32(tmp[j]);
}

std::string describe(const layout& l) {
  return "n " + std::to_string(l.n) + ", block " + std::to_string(l.block) + ", k " + std::to_string(l.k_full) +
         "/" + std::to_string(l.k_tail) + ", " + to_string(l.values) + " values" +
         (l.vblock ? " /" + std::to_string(l.vblock) : std::string()) + ", " +
         (l.bitmap ? "bitmaps" : "u16 indices");
}

// Reads and checks the header and the total length.
result<layout> read_header(std::span<const std::byte> payload) {
  const std::string what = "topk payload: ";
  layout l;
  if (payload.size() < codec_header_bytes)
    return fail(what + std::to_string(payload.size()) + " bytes, shorter than the 32-byte header");
  const std::byte* p = payload.data();
  if (std::memcmp(p, "FZK1", 4) != 0) return fail(what + "bad magic (not FZK1)");
  const auto vt = static_cast<uint8_t>(p[4]), form = static_cast<uint8_t>(p[5]);
  if (vt > 3) return fail(what + "unknown value type " + std::to_string(vt) + " (0 f32, 1 f16, 2 bf16, 3 int8)");
  if (form > 1) return fail(what + "unknown index form " + std::to_string(form) + " (0 u16 indices, 1 bitmap)");
  l.values = static_cast<value_type>(vt);
  const uint32_t vblock = load<uint32_t>(p + 28);
  if (load<uint16_t>(p + 6) != 0 || (l.values != value_type::int8 && vblock != 0))
    return fail(what + "reserved header bytes are not zero");
  if (l.values == value_type::int8 && (vblock < 1 || vblock > codec_max_block))
    return fail(what + "value block of " + std::to_string(vblock) + " values (1.." + std::to_string(codec_max_block) +
                ")");
  l.vblock = l.values == value_type::int8 ? vblock : 0;
  l.bitmap = form == 1;
  l.n = load<uint64_t>(p + 8);
  const uint32_t block = load<uint32_t>(p + 16);
  l.k_full = load<uint32_t>(p + 20);
  l.k_tail = load<uint32_t>(p + 24);
  if (block < 1 || block > codec_max_block)
    return fail(what + "block of " + std::to_string(block) + " elements (1.." + std::to_string(codec_max_block) + ")");
  l.block = block;
  const uint32_t tail = static_cast<uint32_t>(l.n % block);
  if (l.k_full > block)
    return fail(what + "keeps " + std::to_string(l.k_full) + " per block of " + std::to_string(block) + " elements");
  if (l.k_tail > tail)
    return fail(what + "keeps " + std::to_string(l.k_tail) + " in the last block of " + std::to_string(tail) +
                " elements" + (tail ? "" : " (n is a multiple of the block)"));
  l.size();
  if (l.total != payload.size())
    return fail(what + std::to_string(payload.size()) + " bytes, the header implies " +
                (l.total == saturated ? std::string("more than 2^64") : std::to_string(l.total)) + " (" +
                describe(l) + ")");
  return l;
}

status check_positions(const layout& l, uint64_t b, const std::byte* p);

// Checks the positions and, with int8 values, the scales and codes of block b (the section
// starts at p).
status check_block(const layout& l, uint64_t b, const std::byte* p) {
  if (auto sound = check_positions(l, b, p); !sound) return sound;
  if (l.values != value_type::int8) return {};
  const uint32_t len = l.len(b), k = l.kept(b);
  const std::byte* scales = p + l.pos_bytes(len, k);
  if (const std::string bad = quant_detail::check_int8(scales, scales + 4 * l.scales(k), k, l.vblock); !bad.empty())
    return fail("topk payload: " + bad + " (block " + std::to_string(b) + ")");
  return {};
}

status check_positions(const layout& l, uint64_t b, const std::byte* p) {
  const uint32_t len = l.len(b), k = l.kept(b);
  const std::string where = " (block " + std::to_string(b) + ")";
  if (l.bitmap) {
    const uint32_t bytes = (len + 7) / 8;
    uint32_t bits = 0, j = 0;
    for (; j + 8 <= bytes; j += 8) bits += static_cast<uint32_t>(std::popcount(load<uint64_t>(p + j)));
    for (; j < bytes; ++j) bits += static_cast<uint32_t>(std::popcount(static_cast<uint8_t>(p[j])));
    if (len % 8 && (static_cast<uint8_t>(p[bytes - 1]) >> (len % 8)) != 0)
      return fail("topk payload: bitmap has bits set past the " + std::to_string(len) + " elements of its block" +
                  where);
    if (bits != k)
      return fail("topk payload: bitmap has " + std::to_string(bits) + " bits set, the header says " +
                  std::to_string(k) + where);
    return {};
  }
  bool bad = false;  // a branch-free scan first; the slow one only to name the culprit
  uint32_t prev = 0;
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t v = load<uint16_t>(p + 2 * j);
    bad |= (v >= len) | ((j > 0) & (v <= prev));
    prev = v;
  }
  if (!bad) return {};
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t v = load<uint16_t>(p + 2 * j);
    if (v >= len)
      return fail("topk payload: index " + std::to_string(v) + " outside its block of " + std::to_string(len) +
                  " elements" + where);
    if (j > 0 && v <= prev)
      return fail("topk payload: indices not ascending (" + std::to_string(v) + " after " + std::to_string(prev) + ")" +
                  where);
    prev = v;
  }
  return {};
}

// Writes the dense elements of block b of a checked payload (zeros and the kept values).
class block_decoder {
 public:
  explicit block_decoder(const layout& l, const std::byte* payload) : l_(l), payload_(payload) {
    const size_t cap = std::max(l.k_full, l.k_tail) + size_t{16};  // slack for vector loads
    val_.resize(cap);
    tmp_.resize(cap);
  }
  void operator()(uint64_t b, float* dense) {
    const std::byte* p = payload_ + l_.offset(b);
    const uint32_t len = l_.len(b), k = l_.kept(b);
    read_values(p + l_.pos_bytes(len, k), k, l_, val_.data(), tmp_.data());
    if (l_.bitmap) {
      topk_detail::expand_bitmap(reinterpret_cast<const uint8_t*>(p), val_.data(), len, dense);
    } else {
      std::fill(dense, dense + len, 0.0f);
      std::memcpy(tmp_.data(), p, size_t{k} * 2);
      for (uint32_t j = 0; j < k; ++j) dense[tmp_[j]] = val_[j];
    }
  }

 private:
  const layout& l_;
  const std::byte* payload_;
  std::vector<float> val_;
  std::vector<uint16_t> tmp_;
};

}  // namespace

uint64_t topk_payload_bytes(uint64_t n, double ratio, value_type values, uint32_t block, uint32_t value_block) {
  return plan(n, ratio, values, block, value_block).total;
}

uint64_t topk_max_payload_bytes(uint64_t n) {
  // The largest any decodable payload can be: block 1 with every element kept as a u16 index
  // and an int8 code with its own f32 scale, 7 bytes per element.
  return sat_add(codec_header_bytes, sat_mul(n, 7));
}

std::string topk_non_finite_message(uint64_t element, float value, uint32_t block) {
  return "topk: element " + std::to_string(element) + " of the tensor is " + (std::isnan(value) ? "NaN" : "infinite") +
         " (block " + std::to_string(element / std::max<uint32_t>(block, 1)) +
         "): int8 values carry finite values only";
}

void encode_topk(std::span<const float> x, double ratio, value_type values, uint32_t block,
                 std::vector<std::byte>& out, uint32_t value_block) {
  if (!(ratio > 0 && ratio <= 1))
    throw std::invalid_argument("topk: keep ratio " + std::to_string(ratio) + " outside (0, 1]");
  if (block < 1 || block > codec_max_block)
    throw std::invalid_argument("topk: block of " + std::to_string(block) + " elements (1.." +
                                std::to_string(codec_max_block) + ")");
  if (static_cast<uint8_t>(values) > 3)
    throw std::invalid_argument("topk: unknown value type " + std::to_string(static_cast<int>(values)));
  if (values == value_type::int8) {
    if (value_block < 1 || value_block > codec_max_block)
      throw std::invalid_argument("topk: value block of " + std::to_string(value_block) + " values (1.." +
                                  std::to_string(codec_max_block) + ")");
    bool bad = false;  // a branch-free scan first; the slow one only to name the culprit
    for (const float v : x) bad |= (std::bit_cast<uint32_t>(v) & 0x7fffffffu) >= 0x7f800000u;
    if (bad)
      for (size_t i = 0; i < x.size(); ++i)
        if (!std::isfinite(x[i])) throw std::invalid_argument(topk_non_finite_message(i, x[i], block));
  }
  const layout l = plan(x.size(), ratio, values, block, value_block);
  out.resize(l.total);
  std::byte* p = out.data();
  std::memcpy(p, "FZK1", 4);
  p[4] = static_cast<std::byte>(values);
  p[5] = static_cast<std::byte>(l.bitmap ? 1 : 0);
  store<uint16_t>(p + 6, 0);
  store<uint64_t>(p + 8, l.n);
  store<uint32_t>(p + 16, l.block);
  store<uint32_t>(p + 20, l.k_full);
  store<uint32_t>(p + 24, l.k_tail);
  store<uint32_t>(p + 28, l.vblock);

  const size_t cap = std::max(l.k_full, l.k_tail) + size_t{16};  // slack for vector stores
  std::vector<uint16_t> idx(cap), tmp(cap);
  std::vector<float> val(cap);
  topk_detail::select_scratch scratch;
  for (uint64_t b = 0; b < l.blocks(); ++b) {
    const float* xb = x.data() + b * l.block;
    const uint32_t len = l.len(b), k = l.kept(b);
    std::byte* q = p + l.offset(b);
    const topk_detail::block_cut cut = topk_detail::select_block(xb, len, k, scratch);
    const uint32_t kept = topk_detail::emit_block(xb, len, cut, val.data(), l.bitmap ? nullptr : idx.data(),
                                                  reinterpret_cast<uint8_t*>(q));
    if (kept != k) throw std::logic_error("topk: selection kept " + std::to_string(kept) + " of " + std::to_string(k));
    if (!l.bitmap) std::memcpy(q, idx.data(), size_t{k} * 2);
    write_values(q + l.pos_bytes(len, k), val.data(), k, l, tmp.data());
  }
}

status decode_topk(std::span<const std::byte> payload, std::span<float> dst) {
  auto header = read_header(payload);
  if (!header) return header.failed();
  const layout& l = *header;
  if (l.n != dst.size())
    return fail("topk payload: carries " + std::to_string(l.n) + " elements, the destination holds " +
                std::to_string(dst.size()));
  for (uint64_t b = 0; b < l.blocks(); ++b)
    if (auto sound = check_block(l, b, payload.data() + l.offset(b)); !sound) return sound;
  block_decoder decode(l, payload.data());
  for (uint64_t b = 0; b < l.blocks(); ++b) decode(b, dst.data() + b * l.block);
  return {};
}

bool topk_payload_elements(std::span<const std::byte> payload, uint64_t& n) {
  return payload_bytes::elements(payload, "FZK1", codec_header_bytes, n);
}

namespace {

// The topk codec and AdaTopK's (the same payloads; AdaTopK's ratio comes from the scheduler).
class topk_codec_impl final : public codec {
 public:
  explicit topk_codec_impl(bool adaptive) : adaptive_(adaptive) {}
  codec_kind kind() const override { return adaptive_ ? codec_kind::adatopk : codec_kind::topk; }
  codec_kind wire_encoding() const override { return codec_kind::topk; }
  bool adaptive() const override { return adaptive_; }

  codec_settings at(double ratio, const codec_settings& run) const override {
    // adatopk's ladder has quantizing rungs between keep-all and top-k (compression/quant.hpp).
    if (adaptive_ && ratio >= int4_level && ratio < keep_all_ratio)
      return codec_of(ratio >= int8_level ? codec_kind::int8 : codec_kind::int4).at(ratio, run);
    codec_settings s = run;
    s.kind = kind();
    s.keep_ratio = std::clamp(ratio, 1e-6, 1.0);
    // topk at ratio 1 keeps every element and only rounds the values (with f32 values that is no
    // smaller than raw, so raw goes); adatopk's 1 is the rule saying "raw fits".
    if (!adaptive_ && s.keep_ratio >= 1) s.keep_ratio = keep_all_ratio;
    // The ladder's last rungs: the kept values go as int8 (the keep-all rung keeps the run's
    // value type; it is the nearly exact one).
    if (adaptive_ && s.keep_ratio < int4_level) s.values = value_type::int8;
    return s;
  }
  bool encodes(uint64_t n, const codec_settings& s) const override {
    // Ratio 1 is dense and exact: never rounded to f16.
    return s.keep_ratio < 1.0 && payload_bytes(n, s) < sat_mul(n, sizeof(float));
  }
  uint64_t payload_bytes(uint64_t n, const codec_settings& s) const override {
    return topk_payload_bytes(n, s.keep_ratio, s.values, s.block, s.scale_block);
  }
  payload_range payload_limits(uint64_t n) const override { return {codec_header_bytes, topk_max_payload_bytes(n)}; }
  void encode(std::span<const float> x, const codec_settings& s, std::vector<std::byte>& out) const override {
    encode_topk(x, s.keep_ratio, s.values, s.block, out, s.scale_block);
  }
  status decode(std::span<const std::byte> payload, std::span<float> dst) const override {
    return decode_topk(payload, dst);
  }
  std::string describe(const codec_settings& s) const override {
    if (s.keep_ratio >= 1) return name() + " dense";  // ratio 1 sends the raw tensor
    std::ostringstream out;
    out << name() << " " << s.keep_ratio * 100 << "% " << to_string(s.values);
    if (s.values == value_type::int8) out << " /" << s.scale_block;
    if (s.error_feedback) out << " ef";
    return out.str();
  }
  std::vector<codec_settings> examples() const override {
    std::vector<codec_settings> out;
    for (const double ratio : {0.01, 0.1, 0.5, keep_all_ratio})
      for (const value_type v : {value_type::f32, value_type::f16, value_type::bf16})
        for (const uint32_t block : {1u, 7u, 4096u}) out.push_back({kind(), ratio, v, block, false});
    for (const double ratio : {0.01, 0.1, 0.5, keep_all_ratio})
      for (const uint32_t block : {1u, 7u, 4096u})
        for (const uint32_t scale_block : {1u, 5u, 64u}) {
          codec_settings s{kind(), ratio, value_type::int8, block, false};
          s.scale_block = scale_block;
          out.push_back(s);
        }
    return out;
  }
  double error_bound(const codec_settings& s) const override {
    // Per block the dropped elements are the smallest, so their energy is at most the dropped
    // share (1 - k/len <= 1 - ratio) of the block's; a kept value is off by at most the value
    // type's unit roundoff, relatively.
    // int8 values: per run of scale_block values the squared error is at most scale_block
    // (absmax / 254)^2 <= scale_block / 254^2 of the run's energy (as the int8 codec's bound).
    const double q8 = std::sqrt(static_cast<double>(std::clamp<uint32_t>(s.scale_block, 1, codec_max_block))) / 254.0;
    const double u = s.values == value_type::f32    ? 0.0
                     : s.values == value_type::f16  ? 0x1p-11
                     : s.values == value_type::bf16 ? 0x1p-8
                                                    : std::min(1.0, q8) * (1 + 1e-5);
    const double dropped = s.keep_ratio >= 1 ? 0.0 : 1.0 - s.keep_ratio;
    return std::sqrt(dropped + u * u) * (1 + 1e-6) + 1e-7;
  }

 private:
  bool adaptive_;
};

}  // namespace

const codec& topk_codec() {
  static const topk_codec_impl c(false);
  return c;
}

const codec& adatopk_codec() {
  static const topk_codec_impl c(true);
  return c;
}

}  // namespace fusion
