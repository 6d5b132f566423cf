// Where a model's inputs come from. A model file declares what feeds each input node
// (`input { ... feed: "images" }`, docs/model-format.md); a data source fills those feeds with
// reproducible training batches and with evaluation batches:
//
//   feeds        source                                    tensors per batch of B rows
//   tokens       text_source (a corpus, character tokens)  (B, T) i32, (B, T) i32 next tokens
//   targets      or token_source (token shards, BPE;
//                core/token_source.hpp)
//   images       image_source (IDX files: Fashion-MNIST)   (B, 1, H, W) f32 normalised,
//   labels                                                 (B) i32 class ids
//
// A batch depends only on (seed, step) for training and on its index for evaluation, so a
// resumed run sees the batches of an uninterrupted one and every process agrees on them.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace fusion {

/// The interface the coordinator feeds a run from. Implementations throw std::runtime_error in
/// plain words naming the file or input at fault.
class data_source {
 public:
  virtual ~data_source() = default;

  /// One line for the log, e.g. "Fashion-MNIST /usr/share/datasets/fashion-mnist: 60000
  /// training and 10000 test images of 28x28, 10 classes".
  virtual std::string describe() const = 0;
  /// The feeds this source fills, in the order of the tensors of a batch
  /// ({"tokens", "targets"} or {"images", "labels"}).
  virtual std::vector<std::string> feeds() const = 0;
  /// What throughput counts: "tokens" or "images" (how many one row holds is the model's
  /// graph::row_items).
  virtual const char* item_name() const = 0;

  /// Throws std::runtime_error naming the model input when the model's input of feed `i`
  /// (shape for a batch of B rows, dtype) is not what this source fills, e.g. "model input
  /// 'images' is [8, 3, 32, 32] f32, but Fashion-MNIST images are [B, 1, 28, 28] f32".
  virtual void check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const = 0;

  /// Fills training batch `step`: one tensor per feed, allocated by the caller with the model's
  /// input shapes for B rows (B = out[0]->dim(0)).
  virtual void train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const = 0;
  /// Number of full evaluation batches of B rows (0: none).
  virtual int64_t eval_batches(int64_t B) const = 0;
  /// Fills evaluation batch `index` (0 <= index < eval_batches(B)); std::out_of_range otherwise.
  virtual void eval_batch(int64_t index, std::span<tensor* const> out) const = 0;
  /// Text bytes per target token over the first `count` evaluation batches of B rows, so that
  /// a loss in nats per token becomes bits per byte (loss / (ln 2 * this)), comparable between
  /// tokenizers; 1 for characters, NaN where bytes mean nothing (images).
  virtual double eval_bytes_per_token(int64_t count, int64_t B) const {
    (void)count, (void)B;
    return NAN;
  }
};

class text_dataset;

/// A text corpus (core/data.hpp text_dataset) as a data source for a model with context T:
/// training windows as text_dataset::train_batch, evaluation on the validation split.
class text_source final : public data_source {
 public:
  /// `name` is the corpus path, for messages. Throws std::runtime_error naming it when the
  /// corpus is empty or its training split shorter than one sequence (T + 1 tokens).
  text_source(std::shared_ptr<const text_dataset> data, int64_t T, std::string name);

  std::string describe() const override;
  std::vector<std::string> feeds() const override { return {"tokens", "targets"}; }
  const char* item_name() const override { return "tokens"; }
  void check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const override;
  void train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const override;
  /// Throws std::runtime_error naming the corpus when the validation split cannot fill one batch.
  int64_t eval_batches(int64_t B) const override;
  void eval_batch(int64_t index, std::span<tensor* const> out) const override;
  /// One byte per character token.
  double eval_bytes_per_token(int64_t, int64_t) const override { return 1.0; }

 private:
  std::shared_ptr<const text_dataset> data_;
  int64_t T_;
  std::string name_;
};

/// Rows [first, first + count) of a CPU tensor along its first dimension, as a new tensor.
tensor slice_rows(const tensor& t, int64_t first, int64_t count);

}  // namespace fusion
