// The per-block kernels of the topk codec (compression/topk.cpp): which elements of a block
// are kept, writing them out, and expanding them back. Internal to compression/; the tests
// call them directly to check them against a reference.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace fusion::topk_detail {

/// The ordering key of an element: its float bits with the sign cleared. For non-negative
/// floats the integer order is the numeric order, +0 and -0 tie, and every NaN ranks above
/// +inf (NaNs among themselves by payload bits).
inline int32_t magnitude_key(float v) { return static_cast<int32_t>(std::bit_cast<uint32_t>(v) & 0x7fffffffu); }

/// The kept elements of a block: key > t, or key == t at a block-local index <= cut.
struct block_cut {
  int32_t t = 0;
  int32_t cut = -1;
  bool keeps(int32_t key, uint32_t index) const { return key > t || (key == t && static_cast<int32_t>(index) <= cut); }
};

/// Scratch reused from block to block (sized on first use).
struct select_scratch {
  std::vector<int32_t> band;  // keys between the bracket bounds
  int32_t hint = -1;          // the previous block's threshold key (a search hint only)
  int32_t delta = 1 << 19;    // half the width of the first bracket around the hint, in key units
};

/// The cut that keeps the `k` elements of x[0, len) with the largest magnitude_key, ties
/// towards the lower index. 1 <= len <= 65536, k <= len. The result does not depend on the
/// scratch's hint (it only speeds up the search).
block_cut select_block(const float* x, uint32_t len, uint32_t k, select_scratch& s);

/// Writes the kept elements of x[0, len) in index order: their values to `values`, and their
/// block-local indices to `indices` or, when `indices` is null, the bitmap of ceil(len / 8)
/// bytes (bit i of byte j = element 8j+i) to `bitmap`. `values` and `indices` need k + 16
/// slots (vector stores run past the end). Returns how many were kept.
uint32_t emit_block(const float* x, uint32_t len, block_cut c, float* values, uint16_t* indices, uint8_t* bitmap);

/// The dense block of a bitmap: dst[i] = the next of `values` where bit i is set, else 0.
/// `values` needs 16 readable slots past the last one used.
void expand_bitmap(const uint8_t* bitmap, const float* values, uint32_t len, float* dst);

}  // namespace fusion::topk_detail
