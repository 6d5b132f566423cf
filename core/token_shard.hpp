// Token shards in llm.c's format (karpathy/llm.c, dev/data/data_common.py), which its own
// scripts and fusion-data tokenize write:
//
//   offset 0      256 little-endian int32: [0] magic, [1] version, [2] number of tokens N,
//                 the rest 0
//   offset 1024   N tokens, little-endian: uint16 (magic 20240520, version 1: GPT-2's
//                 vocabulary and any other of at most 65,536 tokens) or uint32 (magic
//                 20240801, version 7: llm.c's LLaMA-3 shards, and any larger vocabulary)
//
// Nothing follows the tokens. Shards are read through mmap; every problem is an error that
// names the file and the byte offset of the fault.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fusion {

inline constexpr int32_t shard_magic_u16 = 20240520;  ///< llm.c's GPT-2 shards
inline constexpr int32_t shard_version_u16 = 1;
inline constexpr int32_t shard_magic_u32 = 20240801;  ///< llm.c's LLaMA-3 shards
inline constexpr int32_t shard_version_u32 = 7;
inline constexpr size_t shard_header_bytes = 256 * 4;
/// header[2] is an int32: at most this many tokens per shard.
inline constexpr int64_t shard_max_tokens = INT32_MAX;

/// Bytes per token for a vocabulary of `vocab` tokens: 2 up to 65,536 tokens, else 4.
int shard_width_for(int64_t vocab) noexcept;

/// Writes a shard of `tokens` with `width` bytes per token (2 or 4) to `path` (a temporary file
/// renamed over it, so a reader never sees half a shard). Throws std::runtime_error naming the
/// path when a token does not fit the width, there are too many tokens, or writing fails.
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int width);

/// One shard mapped read-only. Copies share the mapping.
class token_shard {
 public:
  /// Maps `path` and checks its header and length; throws std::runtime_error "PATH: offset K:
  /// problem" for a missing file, a wrong magic or version, a negative count, or a file shorter
  /// (truncated) or longer than its header says.
  explicit token_shard(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  /// Number of tokens.
  int64_t size() const noexcept { return size_; }
  /// Bytes per token, 2 or 4.
  int width() const noexcept { return width_; }
  /// Copies tokens [first, first + n) to `out`. A token of `vocab` or more throws
  /// std::runtime_error naming the file and the token's byte offset: nothing is clamped.
  void read(int64_t first, int64_t n, int32_t* out, int64_t vocab) const;
  /// The largest token id of the shard (-1 when empty).
  int64_t max_token() const;

 private:
  std::string path_;
  std::shared_ptr<const unsigned char> map_;  // the whole file
  int64_t size_ = 0;
  int width_ = 2;
};

}  // namespace fusion
