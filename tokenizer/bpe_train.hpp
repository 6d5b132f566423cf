// Training a byte-level BPE tokenizer on a corpus (fusion-data train-bpe): the corpus is
// pre-tokenized as GPT-2 does (pretokenize.hpp) and its distinct pieces counted; starting from
// the 256 byte tokens, the most frequent adjacent pair of tokens inside the pieces is merged
// into a new token, again and again, until the vocabulary has the size asked for. Ties go to the
// pair of lower (left, right) ids, so the result depends only on the corpus and the size.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.hpp"

namespace fusion::tok {

/// What train_bpe reports while it works.
struct train_progress {
  const char* stage;  ///< "counting" (bytes of corpus read) or "merging" (merges made)
  size_t done, total;
};

/// A tokenizer of `vocab_size` tokens learned from `texts`: ids 0-255 are the bytes (in GPT-2's
/// order), then one token per merge, and "<|endoftext|>" last (as in GPT-2, where it is 50256).
/// Stops early, with a smaller vocabulary, when no pair occurs twice. Throws
/// std::invalid_argument when vocab_size < 257 (the bytes and the end-of-text token).
bpe_tokenizer train_bpe(const std::vector<std::string_view>& texts, int32_t vocab_size, int threads = 1,
                        const std::function<void(const train_progress&)>& progress = {});

}  // namespace fusion::tok
