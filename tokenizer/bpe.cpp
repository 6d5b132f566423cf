#include "tokenizer/bpe.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <queue>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/file_text.hpp"
#include "tokenizer/byte_level.hpp"

namespace fusion::tok {

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

std::string read_file(const std::string& path, const char* what) {
  auto text = read_file_text(path, what);
  if (!text) throw std::runtime_error(text.error());
  return std::move(*text);
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) throw std::runtime_error(path + ": error writing");
}

// FNV-1a, 64 bits: a fingerprint, not a defence against crafted collisions.
struct fnv64 {
  uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  }
  void add(uint64_t v) { add(&v, sizeof v); }
};

// Pieces at most this long are cached (longer ones are rare and would fill the cache).
constexpr size_t cached_piece_bytes = 64;
constexpr size_t cache_entries = 1 << 20;
// Pieces longer than this merge with the heap (merge_long): rescanning is quadratic.
constexpr size_t short_piece_symbols = 48;

}  // namespace

bpe_tokenizer bpe_tokenizer::load(const std::string& dir) {
  const std::string vocab_path = (std::filesystem::path(dir) / "vocab.json").string();
  const std::string merges_path = (std::filesystem::path(dir) / "merges.txt").string();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw std::runtime_error("tokenizer directory " + dir + " not found (it holds vocab.json and merges.txt)");
  std::string vocab = read_file(vocab_path, "tokenizer vocabulary");
  std::string merges = read_file(merges_path, "tokenizer merges file");
  return parse(vocab, merges, vocab_path, merges_path);
}

bpe_tokenizer bpe_tokenizer::parse(std::string_view vocab_json, std::string_view merges_txt,
                                   const std::string& vocab_name, const std::string& merges_name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json.begin(), vocab_json.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(vocab_name + ": byte offset " + std::to_string(e.byte) +
                             ": not valid JSON (a tokenizer vocabulary is one object of \"token\": id)");
  } catch (const nlohmann::json::exception&) {
    // The parser's other refusal: a number beyond a double's range (out_of_range 406).
    throw std::runtime_error(vocab_name + ": a number in it is too large (a tokenizer vocabulary is one object of "
                             "\"token\": id)");
  }
  if (!j.is_object() || j.empty())
    throw std::runtime_error(vocab_name + ": a tokenizer vocabulary is one non-empty JSON object of \"token\": id");
  bpe_tokenizer t;
  t.tokens_.resize(j.size());
  std::vector<bool> seen(j.size(), false);
  std::unordered_map<std::string, int32_t> id_of;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= static_cast<int64_t>(j.size()))
      throw std::runtime_error(vocab_name + ": token \"" + key + "\" has id " + it->dump() + ": ids must be integers 0 to " +
                               std::to_string(j.size() - 1) + " (one per token)");
    auto id = it->get<int32_t>();
    if (seen[id]) throw std::runtime_error(vocab_name + ": id " + std::to_string(id) + " is given to two tokens (one is \"" + key + "\")");
    size_t bad = 0;
    auto bytes = text_to_bytes(key, &bad);
    if (!bytes || bytes->empty())
      throw std::runtime_error(vocab_name + ": token \"" + key + "\" (id " + std::to_string(id) + "): byte " +
                               std::to_string(bad) + " of it is not one of GPT-2's byte characters (byte-level BPE)");
    seen[id] = true;
    id_of.emplace(*bytes, id);
    t.tokens_[id] = std::move(*bytes);
  }
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_map<uint64_t, size_t> line_of;
  size_t line_no = 0, pos = 0;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    auto where = [&] { return merges_name + ":" + std::to_string(line_no) + ": "; };
    size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string_view::npos)
      throw std::runtime_error(where() + "expected two tokens separated by one space, got \"" + std::string(line) + "\"");
    int32_t part[2];
    std::string_view texts[2] = {line.substr(0, sp), line.substr(sp + 1)};
    std::string joined;
    for (int k = 0; k < 2; ++k) {
      auto bytes = text_to_bytes(texts[k]);
      auto found = bytes ? id_of.find(*bytes) : id_of.end();
      if (found == id_of.end())
        throw std::runtime_error(where() + "token \"" + std::string(texts[k]) + "\" is not in " + vocab_name +
                                 ": the merges file does not belong to this vocabulary");
      part[k] = found->second;
      joined += *bytes;
    }
    if (!id_of.count(joined))
      throw std::runtime_error(where() + "the merge \"" + std::string(line) + "\" makes \"" + bytes_to_text(joined) +
                               "\", which is not in " + vocab_name + ": the merges file does not belong to this vocabulary");
    auto [at, fresh] = line_of.emplace(pair_key(part[0], part[1]), line_no);
    if (!fresh) throw std::runtime_error(where() + "repeats the merge of line " + std::to_string(at->second));
    merges.emplace_back(part[0], part[1]);
  }
  for (int b = 0; b < 256; ++b)
    if (!id_of.count(std::string(1, static_cast<char>(b))))
      throw std::runtime_error(vocab_name + ": no token for byte " + std::to_string(b) + " (\"" +
                               bytes_to_text(std::string(1, static_cast<char>(b))) +
                               "\"): a byte-level vocabulary has one for each of the 256 bytes");
  t.merges_ = std::move(merges);
  t.index();
  return t;
}

bpe_tokenizer bpe_tokenizer::from_tokens(std::vector<std::string> tokens, const std::vector<std::pair<int32_t, int32_t>>& merges) {
  bpe_tokenizer t;
  t.tokens_ = std::move(tokens);
  const auto n = static_cast<int32_t>(t.tokens_.size());
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t i = 0; i < n; ++i)
    if (t.tokens_[i].empty() || !id_of.emplace(t.tokens_[i], i).second)
      throw std::invalid_argument("token " + std::to_string(i) + " is empty or repeats another");
  for (int b = 0; b < 256; ++b)
    if (!id_of.count(std::string(1, static_cast<char>(b))))
      throw std::invalid_argument("no token for byte " + std::to_string(b));
  for (auto [a, b] : merges)
    if (a < 0 || b < 0 || a >= n || b >= n || !id_of.count(t.tokens_[a] + t.tokens_[b]))
      throw std::invalid_argument("merge (" + std::to_string(a) + ", " + std::to_string(b) + ") has no result token");
  t.merges_ = merges;
  t.index();
  return t;
}

void bpe_tokenizer::index() {
  std::unordered_map<std::string, int32_t> id_of;
  fnv64 h;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    id_of.emplace(tokens_[i], static_cast<int32_t>(i));
    h.add(tokens_[i].size());
    h.add(tokens_[i].data(), tokens_[i].size());
  }
  for (int b = 0; b < 256; ++b) byte_token_[b] = id_of.at(std::string(1, static_cast<char>(b)));
  merge_of_.clear();
  merge_of_.reserve(merges_.size() * 2);
  for (size_t r = 0; r < merges_.size(); ++r) {
    auto [a, b] = merges_[r];
    merge_of_.emplace(pair_key(a, b), std::pair<int32_t, int32_t>(static_cast<int32_t>(r), id_of.at(tokens_[a] + tokens_[b])));
    h.add(pair_key(a, b));
  }
  auto e = id_of.find(std::string(end_of_text));
  eot_ = e == id_of.end() ? -1 : e->second;
  fingerprint_ = h.h;
  if (!pre_) pre_ = std::make_shared<const pretokenizer>();
}

std::string bpe_tokenizer::vocab_json() const {
  // Written by hand in id order (nlohmann's objects sort keys), ASCII with \u escapes as GPT-2's.
  std::string out = "{";
  char buf[16];
  for (size_t i = 0; i < tokens_.size(); ++i) {
    out += i ? ", \"" : "\"";
    for (char c : tokens_[i]) {
      uint32_t cp = byte_to_char(static_cast<uint8_t>(c));
      if (cp == '"' || cp == '\\') {
        out += '\\';
        out += static_cast<char>(cp);
      } else if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
        out += buf;
      }
    }
    out += "\": " + std::to_string(i);
  }
  return out + "}";
}

std::string bpe_tokenizer::merges_txt() const {
  std::string out = "#version: 0.2\n";
  for (auto [a, b] : merges_) out += bytes_to_text(tokens_[a]) + " " + bytes_to_text(tokens_[b]) + "\n";
  return out;
}

void bpe_tokenizer::save(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create the tokenizer directory: " + ec.message());
  write_file((std::filesystem::path(dir) / "vocab.json").string(), vocab_json());
  write_file((std::filesystem::path(dir) / "merges.txt").string(), merges_txt());
}

void bpe_tokenizer::merge_short(std::vector<int32_t>& syms) const {
  while (syms.size() >= 2) {
    int32_t best_rank = INT32_MAX, a = 0, b = 0, c = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto m = merge_of_.find(pair_key(syms[i], syms[i + 1]));
      if (m != merge_of_.end() && m->second.first < best_rank)
        best_rank = m->second.first, a = syms[i], b = syms[i + 1], c = m->second.second;
    }
    if (best_rank == INT32_MAX) return;
    size_t w = 0;
    for (size_t i = 0; i < syms.size(); ++i) {
      if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
        syms[w++] = c;
        ++i;
      } else {
        syms[w++] = syms[i];
      }
    }
    syms.resize(w);
  }
}

void bpe_tokenizer::merge_long(std::vector<int32_t>& syms) const {
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct entry {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<entry, std::vector<entry>, std::greater<entry>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto m = merge_of_.find(pair_key(syms[pos], syms[next[pos]]));
    if (m != merge_of_.end()) heap.push({m->second.first, pos, syms[pos], syms[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  std::vector<entry> round;
  while (!heap.empty()) {
    // All places of the lowest-ranked pair, left to right, as one round: a pair made during the
    // round waits for the next one, as in GPT-2's rescanning loop.
    const int32_t rank = heap.top().rank;
    round.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      round.push_back(heap.top());
      heap.pop();
    }
    int32_t result = merge_of_.at(pair_key(round[0].left, round[0].right)).second;
    for (const entry& e : round) {
      if (!alive[e.pos] || next[e.pos] < 0 || syms[e.pos] != e.left || syms[next[e.pos]] != e.right) continue;
      int gone = next[e.pos];
      syms[e.pos] = result;
      alive[gone] = false;
      next[e.pos] = next[gone];
      if (next[gone] >= 0) prev[next[gone]] = e.pos;
      push(prev[e.pos]);
      push(e.pos);
    }
  }
  size_t w = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

std::vector<int32_t> bpe_tokenizer::encode_piece(std::string_view piece) const {
  std::vector<int32_t> syms(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) syms[i] = byte_token_[static_cast<uint8_t>(piece[i])];
  if (syms.size() <= short_piece_symbols)
    merge_short(syms);
  else
    merge_long(syms);
  return syms;
}

bool piece_cache::find(std::string_view piece, uint64_t hash, std::span<const int32_t>& ids) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const slot& s = slots_[i];
    if (!s.used) return false;
    if (s.hash == hash && std::string_view(keys_.data() + s.key_at, s.key_len) == piece) {
      ids = {ids_.data() + s.ids_at, s.ids_len};
      return true;
    }
  }
}

void piece_cache::insert(std::string_view piece, uint64_t hash, std::span<const int32_t> ids) {
  if (used_ + 1 > slots_.size() / 2) {  // half full: grow up to the cap, then start over
    const size_t size = slots_.size() < cache_entries * 2 ? slots_.size() * 2 : slots_.size();
    std::vector<slot> old(size);
    old.swap(slots_);
    if (size == old.size()) {
      used_ = 0;
      keys_.clear();
      ids_.clear();
    } else {
      for (const slot& s : old)
        if (s.used)
          for (size_t i = s.hash & (size - 1);; i = (i + 1) & (size - 1))
            if (!slots_[i].used) {
              slots_[i] = s;
              break;
            }
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].used) i = (i + 1) & mask;
  slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
               static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size()), true};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++used_;
}

void bpe_tokenizer::encode_into(std::string_view text, pretokenizer& pre, piece_cache& cache,
                                std::vector<int32_t>& out) const {
  pre.split(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
      return;
    }
    if (piece.size() > cached_piece_bytes) {
      auto ids = encode_piece(piece);
      out.insert(out.end(), ids.begin(), ids.end());
      return;
    }
    const uint64_t h = std::hash<std::string_view>{}(piece);
    std::span<const int32_t> hit;
    if (cache.find(piece, h, hit)) {
      out.insert(out.end(), hit.begin(), hit.end());
      return;
    }
    auto ids = encode_piece(piece);
    cache.insert(piece, h, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  });
}

std::vector<int32_t> bpe_tokenizer::encode(std::string_view text) const {
  if (!pre_) throw std::logic_error("encode on an empty tokenizer");
  pretokenizer pre = pre_->clone();
  piece_cache cache;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  encode_into(text, pre, cache, out);
  return out;
}

std::string bpe_tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= size())
      throw std::runtime_error("token id " + std::to_string(id) + " at position " + std::to_string(i) +
                               " is outside the vocabulary [0, " + std::to_string(size()) + ")");
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

std::vector<std::vector<int32_t>> bpe_tokenizer::encode_parallel(const std::vector<std::string_view>& texts, int threads,
                                                                 const std::function<void(size_t)>& progress) const {
  if (!pre_) throw std::logic_error("encode on an empty tokenizer");
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  struct job {
    size_t text;
    std::string_view bytes;
    std::vector<int32_t> ids;
  };
  std::vector<job> jobs;
  for (size_t t = 0; t < texts.size(); ++t) {
    size_t from = 0;
    for (size_t end : chunk_ends(texts[t], 256 << 10)) {
      jobs.push_back({t, texts[t].substr(from, end - from), {}});
      from = end;
    }
  }
  std::atomic<size_t> next{0}, done_bytes{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto work = [&](bool report) {
    try {
      pretokenizer pre = pre_->clone();
      piece_cache cache;
      for (size_t k; !failed && (k = next.fetch_add(1)) < jobs.size();) {
        jobs[k].ids.reserve(jobs[k].bytes.size() / 3);
        encode_into(jobs[k].bytes, pre, cache, jobs[k].ids);
        size_t d = done_bytes += jobs[k].bytes.size();
        if (report && progress) progress(d);
      }
    } catch (...) {
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work, false);
  work(true);
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  if (progress) progress(done_bytes.load());
  std::vector<std::vector<int32_t>> out(texts.size());
  for (auto& j : jobs) out[j.text].insert(out[j.text].end(), j.ids.begin(), j.ids.end());
  return out;
}

}  // namespace fusion::tok
