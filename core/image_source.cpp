// Shape legend: B rows (images) per batch, H x W pixels per image, N training images.
#include "core/image_source.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "core/data.hpp"
#include "core/idx_file.hpp"

namespace fusion {

namespace {

// What messages call the data: the format is Fashion-MNIST's whatever the directory holds.
constexpr const char* dataset_name = "Fashion-MNIST";
// Separates the shuffle's hash stream from the augmentation's, which also starts from the seed.
constexpr uint64_t perm_salt = 0x5045524d55544531ULL;  // "PERMUTE1"

// The gzip'd file when present, else the raw one; neither: the install hint.
std::string find_idx(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string gz = (fs::path(dir) / (name + ".gz")).string();
  if (fs::exists(gz, ec)) return gz;
  std::string raw = (fs::path(dir) / name).string();
  if (fs::exists(raw, ec)) return raw;
  throw std::runtime_error("IDX file " + gz + " not found (nor " + raw +
                           "): install Debian's dataset-fashion-mnist (scripts/setup.sh)");
}

// One split: images and labels read, counted against each other and the classes checked.
struct split {
  std::string images_path, labels_path;
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels, labels;
};

split load_split(const std::string& dir, const std::string& prefix, int classes) {
  split s;
  s.images_path = find_idx(dir, prefix + "-images-idx3-ubyte");
  s.labels_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
  idx_array images = read_idx(s.images_path, idx_kind::images);
  idx_array labels = read_idx(s.labels_path, idx_kind::labels);
  s.count = images.dims[0];
  s.rows = images.dims[1];
  s.cols = images.dims[2];
  if (labels.dims[0] != s.count)
    throw std::runtime_error(s.labels_path + " holds " + std::to_string(labels.dims[0]) + " labels, but " +
                             s.images_path + " holds " + std::to_string(s.count) + " images");
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= classes)
      throw std::runtime_error(s.labels_path + " is mislabelled: label " + std::to_string(labels.data[i]) +
                               " at index " + std::to_string(i) + ", expected 0.." + std::to_string(classes - 1));
  s.pixels = std::move(images.data);
  s.labels = std::move(labels.data);
  return s;
}

std::string fixed4(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// Maps a 64-bit hash onto [0, n) without the low-bit bias of a modulo.
uint64_t below(uint64_t h, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

}  // namespace

image_source::image_source(const image_options& o) : opts_(o) {
  if (o.classes < 1 || o.classes > 256)
    throw std::invalid_argument(std::to_string(o.classes) +
                                " image classes: IDX labels are bytes, so the number must be between 1 and 256");
  if (o.crop_padding < 0)
    throw std::invalid_argument("image crop padding of " + std::to_string(o.crop_padding) +
                                " pixels: it must be at least 0 (0: no random crop)");
  split train = load_split(o.dir, "train", o.classes);
  split test = load_split(o.dir, "t10k", o.classes);
  if (train.count == 0) throw std::runtime_error(train.images_path + " holds no images: nothing to train on");
  if (test.rows != train.rows || test.cols != train.cols)
    throw std::runtime_error(test.images_path + " holds images of " + std::to_string(test.rows) + "x" +
                             std::to_string(test.cols) + " pixels, but " + train.images_path + " holds " +
                             std::to_string(train.rows) + "x" + std::to_string(train.cols));
  n_train_ = train.count;
  n_test_ = test.count;
  h_ = train.rows;
  w_ = train.cols;
  if (o.crop_padding > std::min(h_, w_))
    throw std::invalid_argument("image crop padding of " + std::to_string(o.crop_padding) +
                                " pixels: it must be at most " + std::to_string(std::min(h_, w_)) +
                                " (the image size, " + std::to_string(h_) + "x" + std::to_string(w_) + ")");

  // Mean and std from a histogram: exact sums, one pass over the bytes.
  std::array<int64_t, 256> counts{};
  for (uint8_t v : train.pixels) ++counts[v];
  const auto n = static_cast<double>(train.pixels.size());
  double sum = 0.0;
  for (int v = 0; v < 256; ++v) sum += static_cast<double>(counts[v]) * (v / 255.0);
  mean_ = sum / n;
  double sq = 0.0;
  for (int v = 0; v < 256; ++v) sq += static_cast<double>(counts[v]) * std::pow(v / 255.0 - mean_, 2);
  std_ = std::sqrt(sq / n);
  if (!(std_ > 0.0))
    throw std::runtime_error(train.images_path + ": every training pixel has the value " +
                             std::to_string(train.pixels[0]) + ", so the images cannot be normalised");
  for (int v = 0; v < 256; ++v) lut_[v] = static_cast<float>((v / 255.0 - mean_) / std_);

  train_pixels_ = std::move(train.pixels);
  train_labels_ = std::move(train.labels);
  test_pixels_ = std::move(test.pixels);
  test_labels_ = std::move(test.labels);
}

std::string image_source::describe() const {
  std::string s = std::string(dataset_name) + " " + opts_.dir + ": " + std::to_string(n_train_) + " training and " +
                  std::to_string(n_test_) + " test images of " + std::to_string(h_) + "x" + std::to_string(w_) +
                  ", " + std::to_string(opts_.classes) + " classes; pixel mean " + fixed4(mean_) + ", std " +
                  fixed4(std_);
  if (opts_.crop_padding > 0) s += "; random crop (padding " + std::to_string(opts_.crop_padding) + ")";
  if (opts_.flip) s += "; random horizontal flip";
  return s;
}

void image_source::check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const {
  if (i > 1)
    throw std::logic_error("internal error: " + std::string(dataset_name) +
                           " fills 2 feeds (images, labels), not feed " + std::to_string(i));
  const bool images = i == 0;
  const bool ok = images ? (shape.size() == 4 && shape[0] >= 1 && shape[1] == 1 && shape[2] == h_ &&
                            shape[3] == w_ && type == dtype::f32)
                         : (shape.size() == 1 && shape[0] >= 1 && type == dtype::i32);
  if (ok) return;
  const std::string want = images ? "images are [B, 1, " + std::to_string(h_) + ", " + std::to_string(w_) + "] f32"
                                  : "labels are [B] i32";
  throw std::runtime_error("model input '" + input_name + "' is " + to_string(shape) + " " + to_string(type) +
                           ", but " + dataset_name + " " + want);
}

int64_t image_source::check_batch(std::span<tensor* const> out, const char* what) const {
  if (out.size() != 2 || !out[0] || !out[1])
    throw std::logic_error(std::string("internal error: a ") + what + " batch of " + dataset_name +
                           " needs 2 tensors (images, labels), got " + std::to_string(out.size()));
  const char* names[2] = {"images", "labels"};
  for (size_t i = 0; i < 2; ++i) {
    check_input(i, names[i], out[i]->shape(), out[i]->type());
    if (out[i]->is_cuda())
      throw std::logic_error(std::string("internal error: the ") + names[i] + " tensor of a " + what +
                             " batch must be on the CPU");
  }
  const int64_t B = out[0]->dim(0);
  if (out[1]->dim(0) != B)
    throw std::logic_error("internal error: a " + std::string(what) + " batch of " + std::to_string(B) +
                           " images with " + std::to_string(out[1]->dim(0)) + " labels");
  return B;
}

const std::vector<uint32_t>& image_source::permutation(uint64_t seed, uint64_t epoch) const {
  if (perm_valid_ && perm_seed_ == seed && perm_epoch_ == epoch) return perm_;
  perm_.resize(static_cast<size_t>(n_train_));
  for (int64_t i = 0; i < n_train_; ++i) perm_[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  const uint64_t key = splitmix64(splitmix64(seed ^ perm_salt) ^ epoch);
  for (int64_t i = n_train_ - 1; i > 0; --i) {
    auto j = below(splitmix64(key ^ static_cast<uint64_t>(i)), static_cast<uint64_t>(i) + 1);
    std::swap(perm_[static_cast<size_t>(i)], perm_[j]);
  }
  perm_valid_ = true;
  perm_seed_ = seed;
  perm_epoch_ = epoch;
  return perm_;
}

int64_t image_source::train_index(uint64_t seed, uint64_t step, int64_t B, int64_t r) const {
  if (B < 1 || r < 0 || r >= B)
    throw std::invalid_argument("row " + std::to_string(r) + " of a batch of " + std::to_string(B) +
                                " images: the batch needs at least 1 row and the row must lie in it");
  // The position step*B + r in 128 bits: it never wraps around, whatever the step.
  const unsigned __int128 p =
      static_cast<unsigned __int128>(step) * static_cast<uint64_t>(B) + static_cast<uint64_t>(r);
  const auto n = static_cast<unsigned __int128>(n_train_);
  return permutation(seed, static_cast<uint64_t>(p / n))[static_cast<size_t>(p % n)];
}

void image_source::write_image(const uint8_t* src, float* dst, int64_t dy, int64_t dx, bool flip) const {
  const int64_t pad = opts_.crop_padding;
  const float black = lut_[0];
  for (int64_t y = 0; y < h_; ++y) {
    float* row = dst + y * w_;
    const int64_t sy = y + dy - pad;
    if (sy < 0 || sy >= h_) {
      std::fill(row, row + w_, black);
      continue;
    }
    const uint8_t* srow = src + sy * w_;
    for (int64_t x = 0; x < w_; ++x) {
      // Crop first, then mirror the cropped image.
      const int64_t sx = (flip ? w_ - 1 - x : x) + dx - pad;
      row[x] = sx < 0 || sx >= w_ ? black : lut_[srow[sx]];
    }
  }
}

void image_source::train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const {
  const int64_t B = check_batch(out, "training");
  float* x = out[0]->data<float>();
  int32_t* y = out[1]->data<int32_t>();
  const int64_t pad = opts_.crop_padding;
  const uint64_t step_key = splitmix64(splitmix64(seed) ^ step);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t idx = train_index(seed, step, B, r);
    // Three draws per row whatever the options, so turning one augmentation on or off leaves
    // the other's choices as they were.
    const uint64_t h1 = splitmix64(step_key ^ static_cast<uint64_t>(r));
    const uint64_t h2 = splitmix64(h1);
    const uint64_t h3 = splitmix64(h2);
    const auto span = static_cast<uint64_t>(2 * pad + 1);
    const auto dy = static_cast<int64_t>(below(h1, span));
    const auto dx = static_cast<int64_t>(below(h2, span));
    const bool flip = opts_.flip && (h3 >> 63) != 0;
    write_image(train_pixels_.data() + idx * h_ * w_, x + r * h_ * w_, dy, dx, flip);
    y[r] = train_labels_[static_cast<size_t>(idx)];
  }
}

int64_t image_source::eval_batches(int64_t B) const {
  if (B < 1) throw std::invalid_argument("evaluation batches of " + std::to_string(B) + " images: need at least 1");
  return n_test_ / B;
}

void image_source::eval_batch(int64_t index, std::span<tensor* const> out) const {
  const int64_t B = check_batch(out, "evaluation");
  const int64_t count = eval_batches(B);
  if (index < 0 || index >= count)
    throw std::out_of_range("evaluation batch " + std::to_string(index) + " out of range [0, " +
                            std::to_string(count) + ")");
  float* x = out[0]->data<float>();
  int32_t* y = out[1]->data<int32_t>();
  const int64_t pad = opts_.crop_padding;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t idx = index * B + r;
    write_image(test_pixels_.data() + idx * h_ * w_, x + r * h_ * w_, pad, pad, false);
    y[r] = test_labels_[static_cast<size_t>(idx)];
  }
}

}  // namespace fusion
