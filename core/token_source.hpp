// Training on token shards (data.kind = tokens): the shards of a directory (llm.c's format,
// core/token_shard.hpp), mapped, as a data source for a model with context T.
//
//   training    every shard *train*.bin is cut into windows of T + 1 tokens that start T apart
//               (x = the first T, y = the last T); the windows of all training shards, in file
//               name order, are numbered 0 .. W-1. Training row r of step s is window
//                   permute(g mod W, key(seed, g div W)),  g = s * B + r
//               with permute a bijection of [0, W) (a Feistel network, cycle-walking), so each
//               epoch visits every window once in an order fixed by the seed, and a batch
//               depends only on (seed, step, B): a run resumed from a checkpoint at step s
//               reads exactly the windows an uninterrupted run reads, with no cursor saved.
//   validation  the windows of the shards *val*.bin, in order, as text_dataset's validation
//               batches (batch i holds windows i*B .. i*B+B-1).
//
// Tokens of the model's vocabulary or beyond stop the run with the file and offset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/data_source.hpp"
#include "core/token_shard.hpp"

namespace fusion {

/// The training and validation shards of `dir`: regular files ending in ".bin" whose name holds
/// "train" (or "val"), each list sorted by name. Throws std::runtime_error naming the directory
/// when it does not exist or holds no training shard.
struct shard_files {
  std::vector<std::string> train, val;
};
shard_files find_shards(const std::string& dir);

/// A bijection of [0, n) chosen by `key` (n >= 1): a 4-round Feistel network over the next
/// power of four, walking the cycle until the value falls inside [0, n).
uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key) noexcept;

class token_source final : public data_source {
 public:
  /// Maps the shards (checking their headers); `vocab` is the model's vocabulary (every token
  /// read is checked against it); token_bytes[id] is the length in bytes of token id (for bits
  /// per byte; its size is the tokenizer's vocabulary). `name` is the directory, for messages.
  token_source(const shard_files& files, int64_t T, int64_t vocab, std::vector<uint32_t> token_bytes, std::string name);

  std::string describe() const override;
  std::vector<std::string> feeds() const override { return {"tokens", "targets"}; }
  const char* item_name() const override { return "tokens"; }
  void check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const override;
  void train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const override;
  int64_t eval_batches(int64_t B) const override;
  void eval_batch(int64_t index, std::span<tensor* const> out) const override;
  double eval_bytes_per_token(int64_t count, int64_t B) const override;

  /// Training windows (W) and validation windows.
  int64_t train_windows() const noexcept { return train_.windows; }
  int64_t val_windows() const noexcept { return val_.windows; }
  /// The training window of row r of step `step` for batches of B rows (see above).
  int64_t train_window(uint64_t seed, uint64_t step, int64_t B, int64_t r) const;

 private:
  struct split {
    std::vector<token_shard> shards;
    std::vector<int64_t> first_window;  // per shard, and the total last
    int64_t windows = 0;
    int64_t tokens = 0;
  };
  static split open(const std::vector<std::string>& files, int64_t T);
  void read_window(const split& s, int64_t w, int32_t* x, int32_t* y) const;

  split train_, val_;
  int64_t T_, vocab_;
  std::vector<uint32_t> token_bytes_;
  std::string name_;
};

}  // namespace fusion
