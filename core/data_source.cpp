#include "core/data_source.hpp"

#include <cstring>
#include <stdexcept>

#include "core/data.hpp"

namespace fusion {

text_source::text_source(std::shared_ptr<const text_dataset> data, int64_t T, std::string name)
    : data_(std::move(data)), T_(T), name_(std::move(name)) {
  try {
    data_->check_train_split(T_);
  } catch (const std::exception& e) {
    throw std::runtime_error("corpus " + name_ + ": " + e.what());
  }
}

std::string text_source::describe() const {
  return "text " + name_ + ": " + std::to_string(data_->train_tokens().size()) + " training and " +
         std::to_string(data_->val_tokens().size()) + " validation tokens, context " + std::to_string(T_);
}

void text_source::check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const {
  if (i > 1 || type != dtype::i32 || shape.size() != 2 || shape[1] != T_)
    throw std::runtime_error("model input '" + input_name + "' is " + to_string(shape) + " " + to_string(type) +
                             ", but text " + (i == 0 ? "tokens" : "targets") + " are [B, " + std::to_string(T_) +
                             "] i32");
}

void text_source::train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const {
  data_->train_batch(seed, step, out[0]->dim(0), T_, out[0]->i32(), out[1]->i32());
}

int64_t text_source::eval_batches(int64_t B) const {
  try {
    return data_->val_batches(B, T_);
  } catch (const std::exception& e) {
    throw std::runtime_error("corpus " + name_ + ": " + e.what());
  }
}

void text_source::eval_batch(int64_t index, std::span<tensor* const> out) const {
  data_->val_batch(index, out[0]->dim(0), T_, out[0]->i32(), out[1]->i32());
}

tensor slice_rows(const tensor& t, int64_t first, int64_t count) {
  shape_t s = t.shape();
  const int64_t rows = s.at(0);
  if (first < 0 || count < 0 || first + count > rows)
    throw std::out_of_range("rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") of a tensor with " + std::to_string(rows));
  const size_t row_bytes = rows ? t.nbytes() / static_cast<size_t>(rows) : 0;
  s[0] = count;
  tensor out = tensor::uninitialized(s, t.type());
  if (count) std::memcpy(out.bytes(), t.bytes() + static_cast<size_t>(first) * row_bytes, row_bytes * count);
  return out;
}

}  // namespace fusion
