// The per-block kernels of the topk codec: the exact k largest keys of a block in O(len).
//
// Every step works on the integer magnitude key (select.hpp). The threshold T is the k-th
// largest key; kept are all keys > T plus the lowest-index keys == T up to k (block_cut). T is
// found in stages, each exact, so the result never depends on the hint:
//  1. a bracket lo < hi with count(key >= lo) >= k > count(key >= hi): the first pass counts
//     around a hint (the previous block's T, or the matching key of a 64-key sample) and
//     gathers the keys in between; bisection in key space with counting passes narrows a
//     bracket that missed or holds too many keys, and the keys in it are gathered again;
//  2. T as the right rank among those few keys (bisection over them, nth_element when tiny);
//  3. only when T is tied and not every tied key fits, a scan for the index of the last one.
// Emission is one more pass with the cut as a predicate. The passes are vector loops:
// AVX-512 (compress/expand), AVX2 (shuffle tables) or branch-free scalar code.
#include "compression/select.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace fusion::topk_detail {
namespace {

constexpr int32_t key_max = std::numeric_limits<int32_t>::max();

// Keys >= t (vectorised reductions).
uint32_t count_ge(const float* x, uint32_t len, int32_t t) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < len; ++i) c += magnitude_key(x[i]) >= t;
  return c;
}
uint32_t count_ge(const int32_t* keys, uint32_t n, int32_t t) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < n; ++i) c += keys[i] >= t;
  return c;
}

#if !defined(__AVX512F__) && defined(__AVX2__)
// For each 8-bit mask: pack, the lanes of its set bits moved to the front; expand, for each set
// lane its rank among the set lanes (one byte per lane).
struct lane_tables {
  std::array<uint64_t, 256> pack{}, expand{};
};
constexpr lane_tables make_lane_tables() {
  lane_tables t;
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t p = 0;
    for (uint32_t b = 0; b < 8; ++b)
      if (m >> b & 1) t.pack[m] |= uint64_t{b} << (8 * p), t.expand[m] |= uint64_t{p} << (8 * b), ++p;
  }
  return t;
}
constexpr lane_tables tables = make_lane_tables();
__m256i lane_perm(const std::array<uint64_t, 256>& table, uint32_t m) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&table[m])));
}
#endif

struct scan_result {
  int32_t max = 0;
  uint32_t ca = 0, cb = 0, nb = 0;  // keys >= a, keys > b, keys in [a, b]
};

// One pass: the largest key, the keys >= a and > b, and the keys in [a, b] (a <= b) gathered to
// band (len + 32 slots).
scan_result scan_band(const float* x, uint32_t len, int32_t a, int32_t b, int32_t* band) {
  scan_result r;
  uint32_t i = 0;
#if defined(__AVX512F__)
  // Two vectors per step (the mask and compress work of one alone leaves the core idle); the
  // band test is one unsigned compare, key - a <= b - a.
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), av = _mm512_set1_epi32(a), bv = _mm512_set1_epi32(b);
  const __m512i width = _mm512_set1_epi32(b - a), one = _mm512_set1_epi32(1);
  __m512i mx0 = _mm512_setzero_si512(), mx1 = mx0, above0 = mx0, above1 = mx0;
  for (; i + 32 <= len; i += 32) {
    const __m512i k0 = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
    const __m512i k1 = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs_mask);
    mx0 = _mm512_maskz_max_epi32(0xffff, mx0, k0);  // maskz: GCC 12 warns on the plain form
    mx1 = _mm512_maskz_max_epi32(0xffff, mx1, k1);
    above0 = _mm512_mask_add_epi32(above0, _mm512_cmpgt_epi32_mask(k0, bv), above0, one);
    above1 = _mm512_mask_add_epi32(above1, _mm512_cmpgt_epi32_mask(k1, bv), above1, one);
    const __mmask16 in0 = _mm512_cmple_epu32_mask(_mm512_sub_epi32(k0, av), width);
    const __mmask16 in1 = _mm512_cmple_epu32_mask(_mm512_sub_epi32(k1, av), width);
    // Register-form compress then a plain store: the memory form is slow on some cores.
    const __m512i c0 = _mm512_maskz_compress_epi32(in0, k0), c1 = _mm512_maskz_compress_epi32(in1, k1);
    const uint32_t n0 = static_cast<uint32_t>(std::popcount(static_cast<uint32_t>(in0)));
    _mm512_storeu_si512(band + r.nb, c0);
    _mm512_storeu_si512(band + r.nb + n0, c1);
    r.nb += n0 + static_cast<uint32_t>(std::popcount(static_cast<uint32_t>(in1)));
  }
  alignas(64) int32_t lanes[16], counts[16];
  _mm512_store_si512(lanes, _mm512_maskz_max_epi32(0xffff, mx0, mx1));
  _mm512_store_si512(counts, _mm512_add_epi32(above0, above1));
  r.max = *std::max_element(lanes, lanes + 16);
  for (int32_t c : counts) r.cb += static_cast<uint32_t>(c);
  r.ca = r.cb + r.nb;
#elif defined(__AVX2__)
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), av = _mm256_set1_epi32(a - 1), bv = _mm256_set1_epi32(b);
  __m256i mx = _mm256_setzero_si256();
  for (; i + 8 <= len; i += 8) {
    const __m256i key = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    mx = _mm256_max_epi32(mx, key);
    const uint32_t ge = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, av))));
    const uint32_t gt = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, bv))));
    const uint32_t in = ge & ~gt;
    const __m256i packed = _mm256_permutevar8x32_epi32(key, lane_perm(tables.pack, in));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(band + r.nb), packed);
    r.ca += static_cast<uint32_t>(std::popcount(ge));
    r.cb += static_cast<uint32_t>(std::popcount(gt));
    r.nb += static_cast<uint32_t>(std::popcount(in));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), mx);
  r.max = *std::max_element(lanes, lanes + 8);
#endif
  for (; i < len; ++i) {  // branch-free: always write, advance only inside the band
    const int32_t key = magnitude_key(x[i]);
    r.max = std::max(r.max, key);
    r.ca += key >= a;
    r.cb += key > b;
    band[r.nb] = key;
    r.nb += (key >= a) & (key <= b);
  }
  return r;
}

// A first guess of T when there is no previous block: the matching rank of 64 strided keys.
int32_t sample_hint(const float* x, uint32_t len, uint32_t k) {
  constexpr uint32_t m = 64;
  std::array<int32_t, m> smp;
  const uint32_t stride = len / m;
  for (uint32_t i = 0; i < m; ++i) smp[i] = magnitude_key(x[i * stride + stride / 2]);
  const uint32_t r = std::min(static_cast<uint32_t>(uint64_t{k} * m / len), m - 1);
  std::nth_element(smp.begin(), smp.begin() + r, smp.end(), std::greater<>());
  return smp[r];
}

// The r-th largest (1-based) of keys[0, n), all in [lo, hi); count(>= lo) >= r > count(>= hi).
// Counting passes over the few keys: interpolation (keys spread about evenly over the bracket)
// with a bisection every third step for a logarithmic worst case.
int32_t band_select(int32_t* keys, uint32_t n, uint32_t r, int64_t lo, int64_t hi) {
  if (n <= 32) {
    std::nth_element(keys, keys + (r - 1), keys + n, std::greater<>());
    return keys[r - 1];
  }
  uint32_t clo = n, chi = 0;  // keys >= lo, keys >= hi
  for (uint32_t step = 1; hi - lo > 1; ++step) {
    int64_t mid = lo + (hi - lo) / 2;
    if (step % 3 != 0) {
      const double f = (clo - r + 0.5) / static_cast<double>(clo - chi);
      mid = std::clamp<int64_t>(lo + static_cast<int64_t>(f * static_cast<double>(hi - lo)), lo + 1, hi - 1);
    }
    const int32_t m = static_cast<int32_t>(mid);
    const uint32_t c = count_ge(keys, n, m);
    if (c == r) {  // exactly r keys >= mid: T is the smallest of them
      int32_t t = key_max;
      for (uint32_t i = 0; i < n; ++i) t = std::min(t, keys[i] | (-static_cast<int32_t>(keys[i] < m) & key_max));
      return t;
    }
    if (c > r)
      lo = mid, clo = c;
    else
      hi = mid, chi = c;
  }
  return static_cast<int32_t>(lo);
}

}  // namespace

block_cut select_block(const float* x, uint32_t len, uint32_t k, select_scratch& s) {
  if (k == 0) return {key_max, -1};
  if (k >= len) return {0, static_cast<int32_t>(len) - 1};
  if (s.band.size() < len + 32u) s.band.resize(len + 32u);
  int32_t* band = s.band.data();

  // Stage 1: the bracket. Counts are monotone in the threshold, so every probe moves lo or hi.
  int64_t lo = 0, hi = 0;
  uint32_t clo = len, chi = 0;
  auto probe = [&](int64_t t, uint32_t c) {
    if (c >= k) {
      if (t > lo) lo = t, clo = c;
    } else if (t < hi) {
      hi = t, chi = c;
    }
  };
  const int32_t hint = s.hint >= 0 ? s.hint : (len >= 256 ? sample_hint(x, len, k) : -1);
  const int32_t delta = s.delta;  // starts at 1/16 of a binade either side of the hint
  const int32_t a = std::max(hint, delta + 1) - delta;
  const int32_t b = std::min(hint, key_max - delta) + delta - 1;
  const scan_result f = scan_band(x, len, a, b, band);
  hi = int64_t{f.max} + 1;
  if (hint >= 0) {
    probe(a, f.ca);
    probe(int64_t{b} + 1, f.cb);
  }
  // The keys gathered in [a, b] are the bracket's when lo == a and as many keys lie above b as
  // above the bracket.
  auto gathered = [&] { return lo == a && chi == f.cb; };
  const uint32_t band_max = 64 + len / 16;
  // The next block's bracket: wider after a miss, narrower when it held too many keys.
  if (hint >= 0 && !gathered())
    s.delta = std::min(s.delta * 2, 1 << 23);
  else if (clo - chi > band_max)
    s.delta = std::max(s.delta / 2, 1 << 12);
  while (clo - chi > band_max && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    probe(mid, count_ge(x, len, static_cast<int32_t>(mid)));
  }

  // Stage 2: T from the keys in [lo, hi).
  int32_t t = static_cast<int32_t>(lo);
  uint32_t above = chi, equal = clo - chi;  // keys > T, keys == T
  if (hi - lo > 1) {
    const uint32_t nb =
        gathered() ? f.nb : scan_band(x, len, static_cast<int32_t>(lo), static_cast<int32_t>(hi - 1), band).nb;
    t = band_select(band, nb, k - chi, lo, hi);
    equal = 0;
    for (uint32_t j = 0; j < nb; ++j) {
      above += band[j] > t;
      equal += band[j] == t;
    }
  }
  s.hint = t;

  // Stage 3: the cut among keys == T.
  const uint32_t quota = k - above;
  if (quota == equal) return {t, static_cast<int32_t>(len) - 1};
  for (uint32_t i = 0, seen = 0; i < len; ++i)
    if (magnitude_key(x[i]) == t && ++seen == quota) return {t, static_cast<int32_t>(i)};
  return {t, static_cast<int32_t>(len) - 1};  // not reached
}

uint32_t emit_block(const float* x, uint32_t len, block_cut c, float* values, uint16_t* indices, uint8_t* bitmap) {
  uint32_t o = 0, i = 0;
#if defined(__AVX512F__)
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), tv = _mm512_set1_epi32(c.t), cv = _mm512_set1_epi32(c.cut);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  auto kept = [&](__m512i key, __m512i at) {
    return static_cast<__mmask16>(_mm512_cmpgt_epi32_mask(key, tv) |
                                  (_mm512_cmpeq_epi32_mask(key, tv) & _mm512_cmple_epi32_mask(at, cv)));
  };
  for (; i + 32 <= len; i += 32) {  // two vectors per step, as in scan_band
    const __m512i x0 = _mm512_loadu_si512(x + i), x1 = _mm512_loadu_si512(x + i + 16);
    const __m512i idx1 = _mm512_add_epi32(idx, step);
    const __mmask16 m0 = kept(_mm512_and_si512(x0, abs_mask), idx), m1 = kept(_mm512_and_si512(x1, abs_mask), idx1);
    const uint32_t n0 = static_cast<uint32_t>(std::popcount(static_cast<uint32_t>(m0)));
    _mm512_storeu_si512(values + o, _mm512_maskz_compress_epi32(m0, x0));
    _mm512_storeu_si512(values + o + n0, _mm512_maskz_compress_epi32(m1, x1));
    if (indices) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + o),
                          _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_compress_epi32(m0, idx)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + o + n0),
                          _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_compress_epi32(m1, idx1)));
    } else {
      const uint32_t m = m0 | static_cast<uint32_t>(m1) << 16;
      std::memcpy(bitmap + i / 8, &m, 4);
    }
    o += n0 + static_cast<uint32_t>(std::popcount(static_cast<uint32_t>(m1)));
    idx = _mm512_add_epi32(idx1, step);
  }
#elif defined(__AVX2__)
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), tv = _mm256_set1_epi32(c.t), cv = _mm256_set1_epi32(c.cut + 1);
  const __m256i step = _mm256_set1_epi32(8);
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; i + 8 <= len; i += 8) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), key = _mm256_and_si256(xv, abs_mask);
    const __m256i keep = _mm256_or_si256(_mm256_cmpgt_epi32(key, tv),
                                         _mm256_and_si256(_mm256_cmpeq_epi32(key, tv), _mm256_cmpgt_epi32(cv, idx)));
    const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(keep)));
    const __m256i perm = lane_perm(tables.pack, m);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + o), _mm256_permutevar8x32_epi32(xv, perm));
    if (indices) {
      const __m256i p = _mm256_permutevar8x32_epi32(idx, perm);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(indices + o),
                       _mm_packus_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
    } else {
      bitmap[i / 8] = static_cast<uint8_t>(m);
    }
    o += static_cast<uint32_t>(std::popcount(m));
    idx = _mm256_add_epi32(idx, step);
  }
#endif
  if (!indices && i < len) std::memset(bitmap + i / 8, 0, (len - i + 7) / 8);
  for (; i < len; ++i) {  // branch-free: always write, advance only when kept
    const bool keep = c.keeps(magnitude_key(x[i]), i);
    values[o] = x[i];
    if (indices)
      indices[o] = static_cast<uint16_t>(i);
    else
      bitmap[i / 8] = static_cast<uint8_t>(bitmap[i / 8] | (keep << (i % 8)));
    o += keep;
  }
  return o;
}

void expand_bitmap(const uint8_t* bitmap, const float* values, uint32_t len, float* dst) {
  uint32_t i = 0, j = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16) {
    uint16_t m;
    std::memcpy(&m, bitmap + i / 8, 2);
    _mm512_storeu_ps(dst + i, _mm512_maskz_expand_ps(m, _mm512_loadu_ps(values + j)));
    j += static_cast<uint32_t>(std::popcount(m));
  }
#elif defined(__AVX2__)
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (; i + 8 <= len; i += 8) {
    const uint32_t m = bitmap[i / 8];
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m)), bits), bits);
    const __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(values + j), lane_perm(tables.expand, m));
    _mm256_storeu_ps(dst + i, _mm256_and_ps(v, _mm256_castsi256_ps(set)));
    j += static_cast<uint32_t>(std::popcount(m));
  }
#endif
  for (; i < len; ++i) {
    const bool set = bitmap[i / 8] >> (i % 8) & 1;
    dst[i] = set ? values[j] : 0.0f;
    j += set;
  }
}

}  // namespace fusion::topk_detail
