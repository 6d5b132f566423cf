// GPT-2's pre-tokenization: text is cut into pieces by the regular expression of OpenAI's
// encoder.py (and tiktoken's "gpt2" encoding),
//
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched by PCRE2 with Unicode properties (UCP) and its JIT compiler. BPE merges never cross
// a piece. Bytes that are not valid UTF-8 match nothing (PCRE2_MATCH_INVALID_UTF); each run of
// them between two matches becomes a piece of its own, so every byte of the input lies in
// exactly one piece and encoding is total over arbitrary bytes.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fusion::tok {

/// GPT-2's pre-tokenization pattern (PCRE2 syntax).
extern const char* const gpt2_pattern;

/// A compiled pattern (shared, read-only) and the per-thread state that matching needs. One
/// pretokenizer per thread: splitting is not thread-safe on one object, but copies made with
/// clone() share the compiled code and may run in parallel.
class pretokenizer {
 public:
  /// Compiles `pattern` (UTF, UCP, invalid UTF-8 allowed) and, unless `use_jit` is false (the
  /// benchmark's reference), JIT-compiles it; throws std::runtime_error naming the offset of a
  /// syntax error.
  explicit pretokenizer(const std::string& pattern = gpt2_pattern, bool use_jit = true);
  ~pretokenizer();
  pretokenizer(pretokenizer&&) noexcept;
  pretokenizer& operator=(pretokenizer&&) noexcept;

  /// A pretokenizer for another thread, sharing the compiled pattern.
  pretokenizer clone() const;
  /// Whether PCRE2's JIT compiled the pattern (false: PCRE2's interpreter, slower).
  bool jit() const noexcept;

  /// Calls fn(piece) for every piece of `text`, in order; the pieces tile `text` exactly.
  void split(std::string_view text, const std::function<void(std::string_view)>& fn);
  /// The pieces of `text` as strings (tests, small inputs).
  std::vector<std::string> pieces(std::string_view text);

 private:
  struct code;
  struct matcher;
  pretokenizer(std::shared_ptr<const code> c);
  std::shared_ptr<const code> code_;
  std::unique_ptr<matcher> matcher_;
};

/// Offsets where `text` may be cut into chunks that pre-tokenize exactly as the whole text
/// does: after a '\n' that follows a printable ASCII byte and precedes one (no whitespace run or
/// look-ahead of the pattern crosses such a cut). Returns the chunk ends, the last = text.size(),
/// each chunk about `target` bytes or more (longer where no such place exists).
std::vector<size_t> chunk_ends(std::string_view text, size_t target);

}  // namespace fusion::tok
