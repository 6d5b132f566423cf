#include "tokenizer/pretokenize.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <stdexcept>

namespace fusion::tok {

const char* const gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct pretokenizer::code {
  pcre2_code* re = nullptr;
  bool jit = false;
  ~code() { pcre2_code_free(re); }
};

// Match data and a JIT stack: per thread, never shared.
struct pretokenizer::matcher {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  explicit matcher(const code& c) {
    data = pcre2_match_data_create_from_pattern(c.re, nullptr);
    context = pcre2_match_context_create(nullptr);
    // A long run of whitespace backtracks through \s+(?!\S): 32 KiB (the default) may not hold it.
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!data || !context || !stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~matcher() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

pretokenizer::pretokenizer(const std::string& pattern, bool use_jit) {
  int err = 0;
  PCRE2_SIZE at = 0;
  auto c = std::make_shared<code>();
  c->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (!c->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::runtime_error("pre-tokenization pattern, offset " + std::to_string(at) + ": " +
                             reinterpret_cast<const char*>(msg));
  }
  c->jit = use_jit && pcre2_jit_compile(c->re, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(c);
  matcher_ = std::make_unique<matcher>(*code_);
}

pretokenizer::pretokenizer(std::shared_ptr<const code> c) : code_(std::move(c)) {
  matcher_ = std::make_unique<matcher>(*code_);
}

pretokenizer::~pretokenizer() = default;
pretokenizer::pretokenizer(pretokenizer&&) noexcept = default;
pretokenizer& pretokenizer::operator=(pretokenizer&&) noexcept = default;

pretokenizer pretokenizer::clone() const { return pretokenizer(code_); }
bool pretokenizer::jit() const noexcept { return code_->jit; }

void pretokenizer::split(std::string_view text, const std::function<void(std::string_view)>& fn) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  size_t window = 256;
  while (start < n) {
    int rc = 0;
    if (code_->jit) {
      rc = pcre2_jit_match(code_->re, subject, n, start, 0, matcher_->data, matcher_->context);
    } else {
      // The interpreter checks the UTF-8 of everything from `start` to the end of the subject on
      // every call (PCRE2_MATCH_INVALID_UTF): quadratic over a long text. It matches in a
      // window instead, grown until the match ends 4 bytes before the window's end (no cut
      // character or look-ahead can have changed it) or the window reaches the end.
      for (;;) {
        const size_t end = std::min(n, start + window);
        rc = pcre2_match(code_->re, subject, end, start, 0, matcher_->data, matcher_->context);
        const bool settled = rc >= 0 && pcre2_get_ovector_pointer(matcher_->data)[1] + 4 <= end;
        if (end == n || settled || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) break;
        window *= 2;
      }
      window = std::max<size_t>(256, window / 2);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      fn(text.substr(start));  // trailing bytes that are not valid UTF-8
      return;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error("pre-tokenization failed at byte offset " + std::to_string(start) + ": " +
                               reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(matcher_->data);
    // Every alternative of the pattern needs a character, so a match is never empty; guard anyway
    // so a custom pattern cannot loop forever.
    if (ov[1] <= ov[0]) throw std::runtime_error("pre-tokenization pattern matched an empty piece");
    if (ov[0] > start) fn(text.substr(start, ov[0] - start));  // invalid UTF-8 between matches
    fn(text.substr(ov[0], ov[1] - ov[0]));
    start = ov[1];
  }
}

std::vector<std::string> pretokenizer::pieces(std::string_view text) {
  std::vector<std::string> out;
  split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::vector<size_t> chunk_ends(std::string_view text, size_t target) {
  auto printable = [](char c) { return c > 0x20 && c < 0x7f; };
  std::vector<size_t> ends;
  size_t from = 0;
  target = std::max<size_t>(target, 1);
  while (from < text.size()) {
    size_t p = from + target;
    bool found = false;
    for (; p < text.size(); ++p)
      if (text[p - 1] == '\n' && p >= 2 && printable(text[p - 2]) && printable(text[p])) {
        found = true;
        break;
      }
    if (!found) p = text.size();
    ends.push_back(p);
    from = p;
  }
  return ends;
}

}  // namespace fusion::tok
