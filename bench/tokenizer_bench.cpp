// fusion-bench-tokenizer: byte-level BPE throughput (tokenizer/) on a text file.
//
// Rates are input bytes / second (MB/s = 1e6 B/s), best of several repetitions:
//   pre-tokenize, interpreter  GPT-2's pattern through PCRE2's interpreter (the reference)
//   pre-tokenize, JIT          the same pattern through PCRE2's JIT (what encoding uses)
//   encode, 1 and 2 threads    pre-tokenization + merges (a piece cache per thread)
//   decode                     token ids back to bytes
// The tokenizer is DIR's (vocab.json + merges.txt) or, without --tokenizer, one of 8,192 tokens
// trained on the file first (its training time is printed too).
//
//   fusion-bench-tokenizer [TEXT] [--tokenizer DIR] [--reps N]     (TEXT default data/kjv.txt)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/data.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/bpe_train.hpp"

using namespace fusion;

namespace {

using clock_type = std::chrono::steady_clock;

double best_seconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string text_path = "data/kjv.txt", tok_dir;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      tok_dir = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (!a.empty() && a[0] != '-') {
      text_path = a;
    } else {
      std::fprintf(stderr, "usage: fusion-bench-tokenizer [TEXT] [--tokenizer DIR] [--reps N]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    const std::string text = read_text_file(text_path);
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::vector<std::string_view> docs = {text};
    tok::bpe_tokenizer t;
    if (tok_dir.empty()) {
      const double s = best_seconds(1, [&] { t = tok::train_bpe(docs, 8192, 1); });
      std::printf("trained an 8192-token tokenizer on %s (%.2f MB) in %.1f s (1 thread)\n", text_path.c_str(), mb, s);
    } else {
      t = tok::bpe_tokenizer::load(tok_dir);
    }
    std::printf("fusion-bench-tokenizer: %s, %.2f MB, tokenizer of %d tokens, best of %d\n", text_path.c_str(), mb,
                t.size(), reps);
    std::printf("%-34s %10s %10s\n", "pass", "MB/s", "vs ref");
    size_t pieces = 0;
    tok::pretokenizer interp(tok::gpt2_pattern, false), jit;
    const double s_interp = best_seconds(reps, [&] {
      pieces = 0;
      interp.split(text, [&](std::string_view) { ++pieces; });
    });
    const double s_jit = best_seconds(reps, [&] { jit.split(text, [&](std::string_view) {}); });
    std::vector<int32_t> ids;
    const double s_enc1 = best_seconds(reps, [&] { ids = t.encode_parallel(docs, 1).at(0); });
    const double s_enc2 = best_seconds(reps, [&] { t.encode_parallel(docs, 2); });
    std::string back;
    const double s_dec = best_seconds(reps, [&] { back = t.decode(ids); });
    if (back != text) {
      std::fprintf(stderr, "fusion-bench-tokenizer: decode(encode(text)) differs from the text\n");
      return 1;
    }
    auto row = [&](const char* name, double s) { std::printf("%-34s %10.1f %9.2fx\n", name, mb / s, s_interp / s); };
    row("pre-tokenize, interpreter (ref)", s_interp);
    row(jit.jit() ? "pre-tokenize, JIT" : "pre-tokenize (no JIT available)", s_jit);
    row("encode, 1 thread", s_enc1);
    row("encode, 2 threads", s_enc2);
    row("decode", s_dec);
    std::printf("%zu pieces, %zu tokens, %.2f bytes per token; round trip exact\n", pieces, ids.size(),
                static_cast<double>(text.size()) / static_cast<double>(ids.size()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-tokenizer: %s\n", e.what());
    return 2;
  }
  return 0;
}
