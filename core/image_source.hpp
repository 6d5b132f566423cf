// Image classification data: Fashion-MNIST (or any dataset laid out like it) from IDX files,
// served as normalised (B, 1, H, W) f32 images and (B) i32 class ids (core/data_source.hpp).
//
// Files, inside image_options::dir, each gzip'd (NAME.gz, preferred) or raw (NAME):
//     train-images-idx3-ubyte  train-labels-idx1-ubyte   training split (60000 for Fashion-MNIST)
//     t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte    test split, used for evaluation (10000)
//
// Normalisation: x = (pixel/255 - mean) / std, mean and std (population) over every pixel of
// the training split, computed at load.
//
// Training batches are epochs of a shuffled training set. Row r of batch `step` (B rows) is
//     p = step*B + r,  epoch = p / N,  image = perm(seed, epoch)[p % N]
// where N is the number of training images and perm(seed, epoch) a Fisher-Yates shuffle of
// 0..N-1 driven by the counter-based hash
//     key = splitmix64(splitmix64(seed ^ perm_salt) ^ epoch)
//     for i = N-1 down to 1: swap(perm[i], perm[(splitmix64(key ^ i) * (i+1)) >> 64])
// so every image is seen once per epoch and a batch depends only on (seed, step) (and B).
// Augmentation draws from h = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ r), the row
// hash of text_dataset: a crop offset (dy, dx) in [0, 2*padding] each and a flip bit.
// Evaluation batch i holds test images [i*B, i*B + B) in file order, never augmented.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/data_source.hpp"

namespace fusion {

/// Where the images come from and how training batches are augmented.
struct image_options {
  std::string dir = "/usr/share/datasets/fashion-mnist";  ///< train-images-idx3-ubyte[.gz], ... inside
  int classes = 10;  ///< labels must lie in 0..classes-1
  /// Random crop: pad by this many zero pixels (after normalisation: the normalised value of
  /// black), crop back to H x W at a random offset; 0: off.
  int crop_padding = 0;
  bool flip = false;  ///< random horizontal flip with probability 1/2
};

/// The IDX image dataset of a directory as a data_source feeding {"images", "labels"}.
///
/// Not thread-safe: train_batch caches the current epoch's permutation in mutable members,
/// which is fine because the coordinator, its only user, fills batches from one thread.
class image_source final : public data_source {
 public:
  /// Loads and checks all four files. Throws std::invalid_argument for options out of range
  /// (classes outside 1..256, crop_padding outside 0..min(H, W)) and std::runtime_error naming
  /// the file for a missing or malformed file, image and label counts that differ, a label
  /// outside 0..classes-1, test images of another size than the training images, or training
  /// images of one flat colour (std 0).
  explicit image_source(const image_options& o);

  std::string describe() const override;
  std::vector<std::string> feeds() const override { return {"images", "labels"}; }
  const char* item_name() const override { return "images"; }
  void check_input(size_t i, const std::string& input_name, const shape_t& shape, dtype type) const override;
  void train_batch(uint64_t seed, uint64_t step, std::span<tensor* const> out) const override;
  /// test_count() / B (std::invalid_argument for B < 1).
  int64_t eval_batches(int64_t B) const override;
  void eval_batch(int64_t index, std::span<tensor* const> out) const override;

  /// Number of training images (N) and of test images.
  int64_t train_count() const noexcept { return n_train_; }
  int64_t test_count() const noexcept { return n_test_; }
  /// Image height (rows) and width (columns) in pixels.
  int64_t height() const noexcept { return h_; }
  int64_t width() const noexcept { return w_; }
  int classes() const noexcept { return opts_.classes; }
  /// Mean and standard deviation of the training pixels scaled to [0, 1].
  double pixel_mean() const noexcept { return mean_; }
  double pixel_std() const noexcept { return std_; }
  /// Normalised value of a raw pixel value (0..255): (v/255 - mean) / std.
  float normalised(uint8_t v) const noexcept { return lut_[v]; }
  /// The training image that row r of batch `step` of B rows shows (the shuffle above).
  int64_t train_index(uint64_t seed, uint64_t step, int64_t B, int64_t r) const;

 private:
  // The checked tensors of a batch: images (B, 1, H, W) f32 and labels (B) i32 on the CPU.
  int64_t check_batch(std::span<tensor* const> out, const char* what) const;
  // Writes image `src` (H*W raw pixels) to `dst`, cropped at (dy, dx) of the padded image and
  // mirrored when `flip`; dy = dx = padding, flip = false is the image itself.
  void write_image(const uint8_t* src, float* dst, int64_t dy, int64_t dx, bool flip) const;
  const std::vector<uint32_t>& permutation(uint64_t seed, uint64_t epoch) const;

  image_options opts_;
  int64_t n_train_ = 0, n_test_ = 0, h_ = 0, w_ = 0;
  std::vector<uint8_t> train_pixels_, train_labels_, test_pixels_, test_labels_;
  double mean_ = 0.0, std_ = 1.0;
  float lut_[256] = {};

  // Cache of the last permutation (single-threaded use, see above).
  mutable bool perm_valid_ = false;
  mutable uint64_t perm_seed_ = 0, perm_epoch_ = 0;
  mutable std::vector<uint32_t> perm_;
};

}  // namespace fusion
