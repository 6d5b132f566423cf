// GPT-2's byte-level BPE tokenizer, in the files GPT-2 ships and Hugging Face and llm.c use:
//
//   vocab.json   {"!": 0, "\"": 1, ..., "Ġthe": 262, ..., "<|endoftext|>": 50256}: every token's
//                bytes written with GPT-2's byte-to-character map (byte_level.hpp), and its id
//   merges.txt   "#version: 0.2" (optional), then one merge per line, "Ġ t" = the tokens "Ġ" and
//                "t" become "Ġt"; earlier lines take precedence
//
// Encoding pre-tokenizes (pretokenize.hpp), then merges inside each piece, lowest merge rank
// first, all occurrences of that pair left to right, as GPT-2's encoder.py does. Decoding is
// the concatenation of the tokens' bytes, so decode(encode(b)) == b for any bytes b.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.hpp"

namespace fusion::tok {

/// The token GPT-2 puts between documents.
inline constexpr std::string_view end_of_text = "<|endoftext|>";

/// Pieces already encoded and their ids, one cache per thread: an open-addressing table over
/// two arenas (piece bytes, ids), so a lookup touches one slot and no list of nodes (a
/// std::unordered_map of strings took a third of the encoding time). Emptied when full.
class piece_cache {
 public:
  /// Whether `piece` (of hash `hash`) is cached; its ids in `ids` when it is (valid until the
  /// next insert).
  bool find(std::string_view piece, uint64_t hash, std::span<const int32_t>& ids) const;
  /// Caches `ids` for `piece` (which find() just missed).
  void insert(std::string_view piece, uint64_t hash, std::span<const int32_t> ids);

 private:
  struct slot {
    uint64_t hash = 0;
    uint32_t key_at = 0, key_len = 0, ids_at = 0, ids_len = 0;
    bool used = false;
  };
  std::vector<slot> slots_ = std::vector<slot>(1 << 16);
  size_t used_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

/// A byte-level BPE vocabulary and its merges. Immutable once loaded; encode() may be called
/// from several threads at once (each call uses its own pre-tokenizer and cache).
class bpe_tokenizer {
 public:
  bpe_tokenizer() = default;

  /// Loads DIR/vocab.json and DIR/merges.txt. Throws std::runtime_error naming the file and
  /// the line or byte offset of a problem: malformed JSON, an id used twice or missing, a
  /// byte without its token, a merge whose parts or result are not in the vocabulary.
  static bpe_tokenizer load(const std::string& dir);
  /// Loads from the two files' contents; `vocab_name` and `merges_name` are used in messages.
  static bpe_tokenizer parse(std::string_view vocab_json, std::string_view merges_txt,
                             const std::string& vocab_name = "vocab.json",
                             const std::string& merges_name = "merges.txt");
  /// Builds a tokenizer from token byte strings (id = index) and merges (pairs of ids, by
  /// rank); every byte must have its one-byte token. Throws std::invalid_argument otherwise.
  static bpe_tokenizer from_tokens(std::vector<std::string> tokens, const std::vector<std::pair<int32_t, int32_t>>& merges);

  /// Writes DIR/vocab.json (ids in order, non-ASCII characters as \u escapes, as GPT-2's
  /// file) and DIR/merges.txt ("#version: 0.2" first); creates DIR. Throws std::runtime_error.
  void save(const std::string& dir) const;
  /// The two files' contents, as save() writes them.
  std::string vocab_json() const;
  std::string merges_txt() const;

  /// Number of tokens (ids are 0 .. size()-1).
  int32_t size() const noexcept { return static_cast<int32_t>(tokens_.size()); }
  /// Number of merges.
  size_t merge_count() const noexcept { return merges_.size(); }
  /// The bytes of token `id`; std::out_of_range for an id outside [0, size()).
  const std::string& token_bytes(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  /// The id of the "<|endoftext|>" token, -1 when the vocabulary has none.
  int32_t eot() const noexcept { return eot_; }
  /// A 64-bit fingerprint of the vocabulary and the merges (checkpoints compare it).
  uint64_t fingerprint() const noexcept { return fingerprint_; }

  /// Token ids of `text` (any bytes). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  /// Appends the ids of `text` to `out`, using `pre` (one per thread) and `cache` (pieces seen
  /// before, one per thread; cleared when it grows past a million entries).
  void encode_into(std::string_view text, pretokenizer& pre, piece_cache& cache, std::vector<int32_t>& out) const;
  /// Token ids of one pre-tokenized piece (no cache).
  std::vector<int32_t> encode_piece(std::string_view piece) const;
  /// Bytes of token ids; an id outside [0, size()) throws std::runtime_error naming it and its
  /// position.
  std::string decode(std::span<const int32_t> ids) const;

  /// Encodes `texts` on `threads` threads (0: one per core), each text cut at places that keep
  /// the result identical to a one-thread encoding (pretokenize.hpp chunk_ends). `progress`, if
  /// set, is called from the calling thread with the bytes done so far.
  std::vector<std::vector<int32_t>> encode_parallel(const std::vector<std::string_view>& texts, int threads,
                                                    const std::function<void(size_t bytes_done)>& progress = {}) const;

 private:
  void index();
  // Merges inside one piece given as a symbol sequence: the simple rescans for short pieces, a
  // heap over linked symbols for long ones (same result: tests/tokenizer compares them).
  void merge_short(std::vector<int32_t>& syms) const;
  void merge_long(std::vector<int32_t>& syms) const;
  friend struct bpe_test_access;

  std::vector<std::string> tokens_;                     // id -> bytes
  std::vector<std::pair<int32_t, int32_t>> merges_;     // rank -> (left, right)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;  // (left, right) -> (rank, result)
  int32_t byte_token_[256] = {};
  int32_t eot_ = -1;
  uint64_t fingerprint_ = 0;
  std::shared_ptr<const pretokenizer> pre_;             // cloned per call
};

}  // namespace fusion::tok
