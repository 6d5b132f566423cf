// Training data: a byte-level character tokenizer and a token dataset that serves reproducible
// (x, y) batches for next-token prediction.
//
// Shape legend: B rows per batch, T tokens per row (context), V vocabulary size.
// x and y are row-major (B, T) int32 buffers; y[b, t] is the token that follows x[b, t].
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fusion {

/// Maps each distinct byte of a corpus to a token id (ids follow increasing byte value).
///
/// Vocabulary file format (text, version 1), chosen so that newline, tab and any other
/// non-printable byte survive editors and diff tools:
///
///     fusion-char-vocab 1        <- header line: magic and format version
///     63                         <- V, the number of entries
///     10                         <- byte value of token 0, in decimal (0..255)
///     32                         <- byte value of token 1
///     ...                        <- V lines in all, strictly increasing, then end of file
///
/// Lines end in '\n' ('\r\n' is accepted on load); nothing else may follow the V entries.
class char_tokenizer {
 public:
  char_tokenizer() { index_.fill(-1); }

  /// Replaces the vocabulary by the sorted distinct bytes of `text`.
  void build(std::string_view text);
  /// Replaces the vocabulary by the one in a vocabulary file; throws std::runtime_error
  /// "PATH:LINE: problem" for a missing or malformed file.
  void load(const std::string& path);
  /// Writes the vocabulary file (to a temporary file renamed over `path`, so readers see the old
  /// or the new file, never half of one); throws std::runtime_error naming the path on failure.
  void save(const std::string& path) const;

  /// V, the number of tokens.
  int size() const noexcept { return static_cast<int>(chars_.size()); }
  /// Byte value of each token id.
  const std::vector<unsigned char>& chars() const noexcept { return chars_; }

  /// Token ids of `text`; a byte outside the vocabulary throws std::runtime_error naming the
  /// character and its byte offset.
  std::vector<int32_t> encode(std::string_view text) const;
  /// Text of token ids; an id outside [0, V) throws std::runtime_error naming it and its position.
  std::string decode(std::span<const int32_t> ids) const;

 private:
  void set_chars(std::vector<unsigned char> chars);

  std::vector<unsigned char> chars_;
  std::array<int16_t, 256> index_{};  // byte value -> token id, -1 when absent
};

/// A token sequence split into a training part and a validation part.
///
/// Split (deterministic): with N tokens, n_val = floor(N * val_fraction) and n_train = N - n_val;
/// train = tokens[0, n_train), val = tokens[n_train, N). For the KJV corpus the validation text
/// is therefore the end of Revelation and the training text everything before it.
class text_dataset {
 public:
  /// Throws std::invalid_argument unless 0 <= val_fraction < 1.
  explicit text_dataset(std::vector<int32_t> tokens, double val_fraction = 0.1);

  std::span<const int32_t> train_tokens() const noexcept;
  std::span<const int32_t> val_tokens() const noexcept;

  /// Fills x (B*T) with B windows of the training split and y with the same windows shifted by
  /// one token. Row r starts at
  ///     h = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ r)
  ///     start = (h * (n_train - T)) >> 64      (128-bit product)
  /// so a batch depends only on (seed, step): resuming at step s reproduces the batches of an
  /// uninterrupted run without any saved cursor. Throws std::invalid_argument for B or T < 1
  /// and std::runtime_error when the training split is shorter than T + 1 tokens.
  void train_batch(uint64_t seed, uint64_t step, int64_t B, int64_t T, int32_t* x,
                   int32_t* y) const;
  /// Throws std::runtime_error, as train_batch would, when the training split is shorter than
  /// the T + 1 tokens one sequence needs, so a run can say so before its first step.
  void check_train_split(int64_t T) const;

  /// Number of full validation batches. Window w covers val[w*T, w*T + T] (x is the first T
  /// tokens, y the last T), so x windows do not overlap; batch i holds windows i*B .. i*B+B-1.
  /// Throws std::runtime_error when the validation split cannot fill even one batch.
  int64_t val_batches(int64_t B, int64_t T) const;
  /// Fills validation batch `index` (0 <= index < val_batches(B, T)); throws std::out_of_range
  /// for another index.
  void val_batch(int64_t index, int64_t B, int64_t T, int32_t* x, int32_t* y) const;

 private:
  std::vector<int32_t> tokens_;
  int64_t n_train_ = 0;
};

/// The splitmix64 finaliser of (x + golden gamma): a counter-based 64-bit hash.
uint64_t splitmix64(uint64_t x) noexcept;

/// Entropy in nats of the token frequency distribution (0 for no tokens); a token outside
/// [0, vocab) throws std::runtime_error. It is the loss of the best context-free model, a
/// yardstick for training curves (KJV characters: about 3.02).
double unigram_entropy(std::span<const int32_t> tokens, int vocab);

/// The whole file as bytes; throws std::runtime_error
/// "corpus file PATH not found: run scripts/get-data.sh" when it does not exist.
std::string read_text_file(const std::string& path);

// ---- the vocabulary file of a corpus ---------------------------------------------------------
//
// The vocabulary follows the corpus: without data.vocab it lives next to the corpus under a
// name derived from it (data/kjv.txt -> data/kjv.vocab), and a vocabulary file that lacks
// characters of the corpus (built from another one) is rebuilt from the corpus with a note
// instead of failing the run.

/// The vocabulary file that goes with a corpus when none is named: the corpus path with its
/// extension replaced by ".vocab" ("data/kjv.txt" -> "data/kjv.vocab", "notes" -> "notes.vocab").
std::string default_vocab_path(const std::string& corpus_path);

/// The distinct bytes of `text` that `tok` has no token for, in increasing order.
std::vector<unsigned char> missing_chars(const char_tokenizer& tok, std::string_view text);

/// What prepare_vocabulary did.
struct vocab_outcome {
  enum class action {
    loaded,     ///< the file existed and covers the corpus (it may hold more characters)
    created,    ///< there was no file: built from the corpus and written
    rebuilt,    ///< the file lacked characters of the corpus: built from the corpus and rewritten
    not_saved,  ///< built from the corpus, but the file could not be written (see note)
  } what = action::loaded;
  std::string note;  ///< one line for the user when rebuilt or not saved; empty otherwise
};

/// Makes `tok` a vocabulary that encodes `text` and keeps the file `vocab_path` in step with it
/// (see the actions above). The file is written atomically (temporary file, then rename), so a
/// run reading it at the same time never sees half of it. A malformed file throws
/// std::runtime_error "PATH:LINE: problem"; a file that cannot be written is no error (not_saved).
vocab_outcome prepare_vocabulary(const std::string& vocab_path, std::string_view text, char_tokenizer& tok);

}  // namespace fusion
