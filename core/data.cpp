// Shape legend: B rows per batch, T tokens per row, V vocabulary size.
#include "core/data.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "base/file_text.hpp"
#include "core/log.hpp"

namespace fusion {

namespace {

constexpr const char* vocab_magic = "fusion-char-vocab 1";

// "'a'" for printable bytes, "byte 10 ('\n')"-style names for the rest, so an error message
// never prints a raw control character.
std::string describe_byte(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "' (byte " +
                                     std::to_string(c) + ")";
  switch (c) {
    case '\n': return "'\\n' (byte 10)";
    case '\r': return "'\\r' (byte 13)";
    case '\t': return "'\\t' (byte 9)";
    default: return "byte " + std::to_string(c);
  }
}

// Strict decimal parse of a whole line: digits only, no sign, no spaces.
bool parse_decimal(std::string_view s, int64_t max, int64_t& out) {
  if (s.empty() || s.size() > 19) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  out = v;
  return true;
}

// Messages here reach users (fusion-train prints them): plain words and the option names a user
// writes (train.batch, data.val-fraction), never class or field names.
void check_batch_shape(int64_t B, int64_t T) {
  if (B < 1 || T < 1)
    throw std::invalid_argument("a batch of " + std::to_string(B) + " sequences of " + std::to_string(T) +
                                " tokens: both numbers must be at least 1");
}

void check_batch_shape(int64_t B, int64_t T, const int32_t* x, const int32_t* y) {
  check_batch_shape(B, T);
  if (!x || !y) throw std::invalid_argument("internal error: no buffer for a data batch");
}

}  // namespace

// ---- char_tokenizer --------------------------------------------------------------------------

void char_tokenizer::set_chars(std::vector<unsigned char> chars) {
  chars_ = std::move(chars);
  index_.fill(-1);
  for (size_t i = 0; i < chars_.size(); ++i) index_[chars_[i]] = static_cast<int16_t>(i);
}

void char_tokenizer::build(std::string_view text) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::vector<unsigned char> chars;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) chars.push_back(static_cast<unsigned char>(b));
  set_chars(std::move(chars));
}

void char_tokenizer::load(const std::string& path) {
  auto text = read_file_text(path, "vocabulary file");
  if (!text) throw std::runtime_error(text.error());
  std::istringstream in(*text);
  int line_no = 0;
  auto fail = [&](const std::string& what) -> void {
    throw std::runtime_error(path + ":" + std::to_string(line_no) + ": " + what);
  };
  std::string line;
  auto next_line = [&](const char* expected) {
    ++line_no;
    if (!std::getline(in, line)) fail(std::string("unexpected end of file, expected ") + expected);
    if (!line.empty() && line.back() == '\r') line.pop_back();
  };

  next_line("the header line");
  if (line != vocab_magic) fail("not a vocabulary file: header must read \"" +
                                std::string(vocab_magic) + "\"");
  next_line("the vocabulary size");
  int64_t count = 0;
  if (!parse_decimal(line, 256, count) || count < 1)
    fail("vocabulary size must be an integer in [1, 256], got \"" + line + "\"");

  std::vector<unsigned char> chars;
  for (int64_t i = 0; i < count; ++i) {
    next_line("a byte value");
    int64_t b = 0;
    if (!parse_decimal(line, 255, b)) fail("byte value must be an integer in [0, 255], got \"" + line + "\"");
    if (!chars.empty() && b <= chars.back())
      fail("byte values must be strictly increasing (" + std::to_string(b) + " after " +
           std::to_string(chars.back()) + ")");
    chars.push_back(static_cast<unsigned char>(b));
  }
  // Anything after the entries means the size line and the entries disagree.
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line != "\r") fail("unexpected content after " + std::to_string(count) + " entries");
  }
  set_chars(std::move(chars));
}

void char_tokenizer::save(const std::string& path) const {
  std::string out = std::string(vocab_magic) + "\n" + std::to_string(chars_.size()) + "\n";
  for (unsigned char c : chars_) out += std::to_string(c) + "\n";
  // A temporary file renamed over `path`: several runs may share one vocabulary file.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(path + ": cannot write vocabulary file: " + std::strerror(errno));
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": error writing vocabulary file");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot write vocabulary file: " + std::strerror(e));
  }
}

std::vector<int32_t> char_tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    int16_t id = index_[c];
    if (id < 0)
      throw std::runtime_error("character " + describe_byte(c) + " at offset " +
                               std::to_string(i) + " is not in the vocabulary");
    ids[i] = id;
  }
  return ids;
}

std::string char_tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= size())
      throw std::runtime_error("token id " + std::to_string(id) + " at position " +
                               std::to_string(i) + " is outside the vocabulary [0, " +
                               std::to_string(size()) + ")");
    out[i] = static_cast<char>(chars_[static_cast<size_t>(id)]);
  }
  return out;
}

// ---- text_dataset ----------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

text_dataset::text_dataset(std::vector<int32_t> tokens, double val_fraction) : tokens_(std::move(tokens)) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw std::invalid_argument("data.val-fraction must be at least 0 and below 1, got " +
                                format_number(val_fraction));
  auto n = static_cast<int64_t>(tokens_.size());
  auto n_val = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  n_train_ = n - n_val;
}

std::span<const int32_t> text_dataset::train_tokens() const noexcept {
  return {tokens_.data(), static_cast<size_t>(n_train_)};
}

std::span<const int32_t> text_dataset::val_tokens() const noexcept {
  return {tokens_.data() + n_train_, tokens_.size() - static_cast<size_t>(n_train_)};
}

void text_dataset::train_batch(uint64_t seed, uint64_t step, int64_t B, int64_t T, int32_t* x,
                               int32_t* y) const {
  check_batch_shape(B, T, x, y);
  check_train_split(T);
  // Valid starts are [0, n_train - T - 1]: the y window ends at start + T <= n_train - 1.
  auto starts = static_cast<uint64_t>(n_train_ - T);
  uint64_t step_key = splitmix64(splitmix64(seed) ^ step);
  for (int64_t r = 0; r < B; ++r) {
    uint64_t h = splitmix64(step_key ^ static_cast<uint64_t>(r));
    // Multiply-shift maps h onto [0, starts) without the low-bit bias of a modulo.
    auto start = static_cast<int64_t>((static_cast<unsigned __int128>(h) * starts) >> 64);
    const int32_t* src = tokens_.data() + start;
    std::copy(src, src + T, x + r * T);
    std::copy(src + 1, src + T + 1, y + r * T);
  }
}

void text_dataset::check_train_split(int64_t T) const {
  if (tokens_.empty()) throw std::runtime_error("the corpus is empty: name a text file with data.file");
  if (n_train_ < T + 1)
    throw std::runtime_error("training split has " + std::to_string(n_train_) +
                             " tokens (the corpus less its data.val-fraction tail), fewer than the " +
                             std::to_string(T + 1) + " one sequence needs (the model's context + 1): "
                             "use a longer corpus or a smaller data.val-fraction");
}

int64_t text_dataset::val_batches(int64_t B, int64_t T) const {
  check_batch_shape(B, T);
  auto n_val = static_cast<int64_t>(tokens_.size()) - n_train_;
  int64_t windows = n_val >= T + 1 ? (n_val - 1) / T : 0;
  int64_t batches = windows / B;
  if (batches == 0)
    throw std::runtime_error("validation split has " + std::to_string(n_val) +
                             " tokens (the data.val-fraction tail of the corpus), fewer than the " +
                             std::to_string(B * T + 1) + " one validation batch needs (train.batch " +
                             std::to_string(B) + " sequences of " + std::to_string(T) +
                             " tokens, the model's context, plus one): raise data.val-fraction or lower "
                             "train.batch, or set train.eval-batches=0 to train without validation");
  return batches;
}

void text_dataset::val_batch(int64_t index, int64_t B, int64_t T, int32_t* x, int32_t* y) const {
  check_batch_shape(B, T, x, y);
  int64_t count = val_batches(B, T);
  if (index < 0 || index >= count)
    throw std::out_of_range("validation batch " + std::to_string(index) +
                            " out of range [0, " + std::to_string(count) + ")");
  const int32_t* val = tokens_.data() + n_train_;
  for (int64_t r = 0; r < B; ++r) {
    const int32_t* src = val + (index * B + r) * T;
    std::copy(src, src + T, x + r * T);
    std::copy(src + 1, src + T + 1, y + r * T);
  }
}

// ---- corpus helpers --------------------------------------------------------------------------

double unigram_entropy(std::span<const int32_t> tokens, int vocab) {
  if (vocab < 1)
    throw std::invalid_argument("a vocabulary of " + std::to_string(vocab) + " tokens: it needs at least 1");
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t >= vocab)
      throw std::runtime_error("token " + std::to_string(t) + " at position " +
                               std::to_string(i) + " is outside [0, " + std::to_string(vocab) + ")");
    ++counts[static_cast<size_t>(t)];
  }
  if (tokens.empty()) return 0.0;
  auto n = static_cast<double>(tokens.size());
  double h = 0.0;
  for (int64_t c : counts)
    if (c > 0) {
      double p = static_cast<double>(c) / n;
      h -= p * std::log(p);
    }
  return h;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && !std::filesystem::exists(path, ec) && !ec) {
    // Only the shipped corpus comes from scripts/get-data.sh; a user's own file is simply missing.
    const std::string_view corpus = "data/kjv.txt";
    const bool shipped = path.size() >= corpus.size() && path.compare(path.size() - corpus.size(), corpus.size(), corpus) == 0;
    throw std::runtime_error("corpus file " + path + " not found" +
                             (shipped ? ": run scripts/get-data.sh" : ": check data.file (or --data.file)"));
  }
  auto text = read_file_text(path, "corpus file");
  if (!text) throw std::runtime_error(text.error());
  return std::move(*text);
}

// ---- the vocabulary file of a corpus ---------------------------------------------------------

std::string default_vocab_path(const std::string& corpus_path) {
  std::filesystem::path p(corpus_path);
  if (p.filename().empty()) return corpus_path + ".vocab";
  return p.replace_extension(".vocab").string();
}

std::vector<unsigned char> missing_chars(const char_tokenizer& tok, std::string_view text) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::array<bool, 256> known{};
  for (unsigned char c : tok.chars()) known[c] = true;
  std::vector<unsigned char> out;
  for (int b = 0; b < 256; ++b)
    if (seen[b] && !known[b]) out.push_back(static_cast<unsigned char>(b));
  return out;
}

vocab_outcome prepare_vocabulary(const std::string& vocab_path, std::string_view text, char_tokenizer& tok) {
  vocab_outcome out;
  std::error_code ec;
  if (std::filesystem::exists(vocab_path, ec)) {
    tok.load(vocab_path);
    auto missing = missing_chars(tok, text);
    if (missing.empty()) return out;
    std::string which;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) which += (i ? ", " : "") + describe_byte(missing[i]);
    if (missing.size() > 5) which += ", ...";
    out.what = vocab_outcome::action::rebuilt;
    out.note = "vocabulary " + vocab_path + " lacks " + std::to_string(missing.size()) + " character" +
               (missing.size() == 1 ? "" : "s") + " of the corpus (" + which +
               "): it was built from another corpus; rebuilt from this one";
  } else {
    out.what = vocab_outcome::action::created;
  }
  tok.build(text);
  try {
    auto parent = std::filesystem::path(vocab_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    tok.save(vocab_path);
  } catch (const std::exception& e) {
    out.what = vocab_outcome::action::not_saved;
    out.note = std::string(e.what()) + "; using the corpus's vocabulary without saving it";
  }
  return out;
}

}  // namespace fusion
