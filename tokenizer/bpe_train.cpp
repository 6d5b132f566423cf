#include "tokenizer/bpe_train.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <queue>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/byte_level.hpp"

namespace fusion::tok {

namespace {

uint64_t key_of(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
int32_t left_of(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t right_of(uint64_t k) { return static_cast<int32_t>(k & 0xffffffffu); }

using piece_counts = std::unordered_map<std::string, int64_t>;

// Distinct pieces of the texts and how often each occurs, counted on `threads` threads over
// chunks cut where pre-tokenization is unchanged.
piece_counts count_pieces(const std::vector<std::string_view>& texts, int threads,
                          const std::function<void(const train_progress&)>& progress) {
  std::vector<std::string_view> chunks;
  size_t total = 0;
  for (auto t : texts) {
    size_t from = 0;
    for (size_t end : chunk_ends(t, 256 << 10)) {
      chunks.push_back(t.substr(from, end - from));
      from = end;
    }
    total += t.size();
  }
  threads = std::max(1, threads);
  std::vector<piece_counts> partial(static_cast<size_t>(threads));
  std::atomic<size_t> next{0}, done{0};
  pretokenizer proto;
  auto work = [&](int w) {
    pretokenizer pre = proto.clone();
    for (size_t k; (k = next.fetch_add(1)) < chunks.size();) {
      pre.split(chunks[k], [&](std::string_view p) { ++partial[w][std::string(p)]; });
      size_t d = done += chunks[k].size();
      if (w == 0 && progress) progress({"counting", d, total});
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& th : pool) th.join();
  for (int w = 1; w < threads; ++w)
    for (auto& [p, n] : partial[w]) partial[0][p] += n;
  if (progress) progress({"counting", total, total});
  return std::move(partial[0]);
}

}  // namespace

bpe_tokenizer train_bpe(const std::vector<std::string_view>& texts, int32_t vocab_size, int threads,
                        const std::function<void(const train_progress&)>& progress) {
  if (vocab_size < 257)
    throw std::invalid_argument("a vocabulary of " + std::to_string(vocab_size) +
                                " tokens: it needs at least 257 (the 256 bytes and <|endoftext|>)");
  piece_counts counted = count_pieces(texts, threads, progress);
  // Pieces sorted by their bytes: the merge order must not depend on hash-table order.
  std::vector<std::pair<std::string, int64_t>> sorted(counted.begin(), counted.end());
  counted.clear();
  std::sort(sorted.begin(), sorted.end());

  std::vector<std::string> tokens;
  int32_t byte_id[256];
  for (uint8_t b : gpt2_byte_order()) {
    byte_id[b] = static_cast<int32_t>(tokens.size());
    tokens.emplace_back(1, static_cast<char>(b));
  }
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < tokens.size(); ++i) id_of.emplace(tokens[i], static_cast<int32_t>(i));

  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;  // may hold stale or repeated entries
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (char c : sorted[w].first) words[w].push_back(byte_id[static_cast<uint8_t>(c)]);
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = key_of(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      auto& ws = pair_words[k];
      if (ws.empty() || ws.back() != w) ws.push_back(static_cast<uint32_t>(w));
    }
  }
  sorted.clear();

  // Max-heap on (count, then lower key); an entry whose count is stale is re-queued when popped.
  using entry = std::pair<int64_t, uint64_t>;
  auto worse = [](const entry& x, const entry& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<entry, std::vector<entry>, decltype(worse)> heap(worse);
  for (auto& [k, n] : pair_count) heap.push({n, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  const auto target = static_cast<size_t>(vocab_size - 1);  // the last id is <|endoftext|>
  const size_t wanted = target - tokens.size();
  std::vector<uint32_t> stamp(words.size(), UINT32_MAX);
  while (tokens.size() < target && !heap.empty()) {
    auto [n, k] = heap.top();
    heap.pop();
    auto it = pair_count.find(k);
    int64_t now = it == pair_count.end() ? 0 : it->second;
    if (now != n) {
      if (now > 0) heap.push({now, k});
      continue;
    }
    if (n < 2) break;  // a pair seen once teaches nothing
    const int32_t a = left_of(k), b = right_of(k);
    std::string joined = tokens[a] + tokens[b];
    int32_t c;
    if (auto found = id_of.find(joined); found != id_of.end()) {
      c = found->second;  // made before from other parts: the merge reuses its id
    } else {
      c = static_cast<int32_t>(tokens.size());
      id_of.emplace(joined, c);
      tokens.push_back(std::move(joined));
    }
    const auto rank = static_cast<uint32_t>(merges.size());
    merges.emplace_back(a, b);
    std::unordered_set<uint64_t> raised;
    std::vector<uint32_t> affected = std::move(pair_words[k]);
    pair_words.erase(k);
    for (uint32_t w : affected) {
      if (stamp[w] == rank) continue;
      stamp[w] = rank;
      auto& syms = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < syms.size() && !has; ++i) has = syms[i] == a && syms[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        auto& cnt = pair_count[key_of(syms[i], syms[i + 1])];
        cnt -= freq[w];
      }
      size_t out = 0;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          syms[out++] = c;
          ++i;
        } else {
          syms[out++] = syms[i];
        }
      }
      syms.resize(out);
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        uint64_t nk = key_of(syms[i], syms[i + 1]);
        pair_count[nk] += freq[w];
        if (syms[i] == c || syms[i + 1] == c) {
          raised.insert(nk);
          auto& ws = pair_words[nk];
          if (ws.empty() || ws.back() != w) ws.push_back(w);
        }
      }
    }
    pair_count.erase(k);
    for (uint64_t nk : raised)
      if (auto f = pair_count.find(nk); f != pair_count.end() && f->second > 0) heap.push({f->second, nk});
    if (progress && (merges.size() % 64 == 0 || tokens.size() == target))
      progress({"merging", tokens.size() - 256, wanted});
  }
  if (progress) progress({"merging", tokens.size() - 256, wanted});
  tokens.emplace_back(end_of_text);
  return bpe_tokenizer::from_tokens(std::move(tokens), merges);
}

}  // namespace fusion::tok
