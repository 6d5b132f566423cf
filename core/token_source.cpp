#include "core/token_source.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "core/data.hpp"

namespace fusion {

shard_files find_shards(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error("token shard directory " + dir + " not found (make it with fusion-data tokenize)");
  shard_files out;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    const std::string name = e.path().filename().string();
    if (name.find("train") != std::string::npos)
      out.train.push_back(e.path().string());
    else if (name.find("val") != std::string::npos)
      out.val.push_back(e.path().string());
  }
  if (ec) throw std::runtime_error("token shard directory " + dir + ": " + ec.message());
  std::sort(out.train.begin(), out.train.end());
  std::sort(out.val.begin(), out.val.end());
  if (out.train.empty())
    throw std::runtime_error("token shard directory " + dir + " holds no training shard (*train*.bin)");
  return out;
}

uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key) noexcept {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  do {  // cycle-walking: at most about four rounds on average, since n > 4^(half-1)
    uint64_t l = i >> half, r = i & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = splitmix64(key ^ (round << 56) ^ r) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    i = (l << half) | r;
  } while (i >= n);
  return i;
}

token_source::split token_source::open(const std::vector<std::string>& files, int64_t T) {
  split s;
  for (auto& f : files) {
    s.shards.emplace_back(f);
    s.first_window.push_back(s.windows);
    const int64_t n = s.shards.back().size();
    s.windows += n >= T + 1 ? (n - 1) / T : 0;
    s.tokens += n;
  }
  s.first_window.push_back(s.windows);
  return s;
}

token_source::token_source(const shard_files& files, int64_t T, int64_t vocab, std::vector<uint32_t> token_bytes,
                           std::string name)
    : train_(open(files.train, T)), val_(open(files.val, T)), T_(T), vocab_(vocab),
      token_bytes_(std::move(token_bytes)), name_(std::move(name)) {
  if (train_.windows == 0)
    throw std::runtime_error("token shards " + name_ + ": the training shards hold " + std::to_string(train_.tokens) +
                             " tokens, no shard has the " + std::to_string(T + 1) +
                             " one sequence needs (the model's context + 1)");
}

std::string token_source::describe() const {
  return "token shards " + name_ + ": " + std::to_string(train_.tokens) + " training tokens in " +
         std::to_string(train_.shards.size()) + " shard" + (train_.shards.size() == 1 ? "" : "s") + ", " +
         std::to_string(val_.tokens) + " validation tokens, context " + std::to_string(T_);
}

void token_source::check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const {
  if (i > 1 || type != dtype::i32 || shape.size() != 2 || shape[1] != T_)
    throw std::runtime_error("model input '" + input_name + "' is " + to_string(shape) + " " + to_string(type) +
                             ", but token " + (i == 0 ? "inputs" : "targets") + " are [B, " + std::to_string(T_) + "] i32");
}

void token_source::read_window(const split& s, int64_t w, int32_t* x, int32_t* y) const {
  auto it = std::upper_bound(s.first_window.begin(), s.first_window.end(), w);
  const size_t shard = static_cast<size_t>(it - s.first_window.begin()) - 1;
  const int64_t start = (w - s.first_window[shard]) * T_;
  s.shards[shard].read(start, T_, x, vocab_);
  // y is x shifted by one: copy T-1 tokens and read the last one.
  std::copy(x + 1, x + T_, y);
  s.shards[shard].read(start + T_, 1, y + T_ - 1, vocab_);
}

int64_t token_source::train_window(uint64_t seed, uint64_t step, int64_t B, int64_t r) const {
  const auto W = static_cast<uint64_t>(train_.windows);
  const uint64_t g = step * static_cast<uint64_t>(B) + static_cast<uint64_t>(r);
  const uint64_t key = splitmix64(splitmix64(seed) ^ (g / W));
  return static_cast<int64_t>(permute_index(g % W, W, key));
}

void token_source::train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const {
  const int64_t B = out[0]->dim(0);
  for (int64_t r = 0; r < B; ++r)
    read_window(train_, train_window(seed, step, B, r), out[0]->i32() + r * T_, out[1]->i32() + r * T_);
}

int64_t token_source::eval_batches(int64_t B) const {
  const int64_t batches = B > 0 ? val_.windows / B : 0;
  if (batches == 0)
    throw std::runtime_error("token shards " + name_ + ": the validation shards (*val*.bin) hold " +
                             std::to_string(val_.windows) + " windows of " + std::to_string(T_ + 1) +
                             " tokens, fewer than one batch of " + std::to_string(B) +
                             ": tokenize with a larger --val-fraction, lower train.batch, or set train.eval-batches=0");
  return batches;
}

void token_source::eval_batch(int64_t index, std::span<tensor* const> out) const {
  const int64_t B = out[0]->dim(0);
  const int64_t count = eval_batches(B);
  if (index < 0 || index >= count)
    throw std::out_of_range("validation batch " + std::to_string(index) + " out of range [0, " + std::to_string(count) + ")");
  for (int64_t r = 0; r < B; ++r) read_window(val_, index * B + r, out[0]->i32() + r * T_, out[1]->i32() + r * T_);
}

double token_source::eval_bytes_per_token(int64_t count, int64_t B) const {
  std::vector<int32_t> x(static_cast<size_t>(T_)), y(static_cast<size_t>(T_));
  double bytes = 0;
  for (int64_t w = 0; w < count * B && w < val_.windows; ++w) {
    read_window(val_, w, x.data(), y.data());
    for (int32_t t : y) {
      if (static_cast<size_t>(t) >= token_bytes_.size()) return NAN;  // a model token the tokenizer lacks
      bytes += token_bytes_[static_cast<size_t>(t)];
    }
  }
  const double tokens = static_cast<double>(std::min(count * B, val_.windows) * T_);
  return tokens > 0 ? bytes / tokens : NAN;
}

}  // namespace fusion
