// Fuzzes the BPE tokenizer's file reader (tokenizer/bpe.hpp bpe_tokenizer::parse): vocab.json
// (JSON, ids, the byte map) and merges.txt (lines, parts, results) from untrusted files. The
// input is split at its first NUL byte into the two files' contents. parse's contract is
// std::runtime_error naming the file; a tokenizer it accepts must round-trip any bytes, and
// the input itself is encoded and decoded as a check.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tokenizer/bpe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view vocab = in.substr(0, nul);
  const std::string_view merges = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  fusion::tok::bpe_tokenizer t;
  try {
    t = fusion::tok::bpe_tokenizer::parse(vocab, merges);
  } catch (const std::runtime_error&) {
    return 0;
  }
  const auto ids = t.encode(in);
  if (t.decode(ids) != in) std::abort();  // an accepted tokenizer lost bytes
  return 0;
}
