// Tests of the IDX reader and the image data source on small synthetic datasets (gzip'd and raw
// files), and one load of the real Fashion-MNIST when Debian's dataset-fashion-mnist is installed.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/idx_file.hpp"
#include "core/image_source.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::scratch_dir;
using fusion::test::write_file;
namespace fs = std::filesystem;

namespace {

// The message of what `fn` throws, "" when it does not throw.
template <class F> std::string error_of(F&& fn) {
  try { fn(); } catch (const std::exception& e) { return e.what(); }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void write_gz(const fs::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// Image i: pixel 0 holds i % 256, pixel 1 holds i / 256 (so a batch row tells which image it
// is), the rest a pattern that is not left-right symmetric; label i % classes.
struct synthetic {
  int64_t n_train = 50, n_test = 20, h = 6, w = 5;
  int classes = 10;
  bool gzip = true;

  std::vector<uint8_t> pixels(int64_t n, int salt) const {
    std::vector<uint8_t> px(static_cast<size_t>(n * h * w));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k)
        px[static_cast<size_t>(i * h * w + k)] =
            static_cast<uint8_t>(k == 0 ? i % 256 : k == 1 ? i / 256 : (i * 7 + k * k * 13 + salt) % 256);
    return px;
  }
  std::vector<uint8_t> labels(int64_t n) const {
    std::vector<uint8_t> l(static_cast<size_t>(n));
    for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<uint8_t>(i % static_cast<size_t>(classes));
    return l;
  }
  void put(const fs::path& dir, const std::string& name, const std::string& bytes) const {
    gzip ? write_gz(dir / (name + ".gz"), bytes) : write_file(dir / name, bytes);
  }
  void write(const fs::path& dir) const {
    fs::create_directories(dir);
    put(dir, "train-images-idx3-ubyte", encode_idx(idx_kind::images, {n_train, h, w}, pixels(n_train, 0)));
    put(dir, "train-labels-idx1-ubyte", encode_idx(idx_kind::labels, {n_train}, labels(n_train)));
    put(dir, "t10k-images-idx3-ubyte", encode_idx(idx_kind::images, {n_test, h, w}, pixels(n_test, 99)));
    put(dir, "t10k-labels-idx1-ubyte", encode_idx(idx_kind::labels, {n_test}, labels(n_test)));
  }
};

image_options options_for(const fs::path& dir, int crop = 0, bool flip = false) {
  return image_options{.dir = dir.string(), .crop_padding = crop, .flip = flip};
}

// One batch of B rows as tensors, with the span the data source fills.
struct batch {
  tensor images, labels;
  tensor* ptrs[2];
  batch(const image_source& s, int64_t B)
      : images({B, 1, s.height(), s.width()}, dtype::f32), labels({B}, dtype::i32), ptrs{&images, &labels} {}
  std::span<tensor* const> out() { return ptrs; }
  std::vector<float> row_vec(int64_t r) const {
    const int64_t hw = images.dim(2) * images.dim(3);
    return {images.f32() + r * hw, images.f32() + (r + 1) * hw};
  }
};

// The raw pixel value a normalised value came from.
int raw_of(const image_source& s, float x) {
  return static_cast<int>(std::lround((x * s.pixel_std() + s.pixel_mean()) * 255.0));
}
int64_t image_of(const image_source& s, const float* row) { return raw_of(s, row[0]) + 256 * raw_of(s, row[1]); }

// The source's image transform written out plainly: crop (dy, dx) of the padded image, then mirror.
std::vector<float> transformed(const image_source& s, const std::vector<uint8_t>& px, int64_t idx, int pad,
                               int64_t dy, int64_t dx, bool flip) {
  const int64_t h = s.height(), w = s.width();
  std::vector<float> out(static_cast<size_t>(h * w));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      int64_t sy = y + dy - pad, sx = (flip ? w - 1 - x : x) + dx - pad;
      bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
      uint8_t v = inside ? px[static_cast<size_t>(idx * h * w + sy * w + sx)] : 0;
      out[static_cast<size_t>(y * w + x)] = s.normalised(v);
    }
  return out;
}

}  // namespace

TEST_CASE("core/idx_file: gzip'd and raw files read alike") {
  scratch_dir dir("idx", "read");
  std::vector<uint8_t> px{1, 2, 3, 4, 5, 6, 250, 251, 252, 253, 254, 255};
  std::string bytes = encode_idx(idx_kind::images, {2, 3, 2}, px);
  CHECK(bytes.substr(0, 8) == std::string("\0\0\x08\x03\0\0\0\x02", 8));
  write_file(dir / "raw", bytes);
  write_gz(dir / "packed.gz", bytes);
  for (const char* name : {"raw", "packed.gz"}) {
    idx_array a = read_idx((dir / name).string(), idx_kind::images);
    CHECK(a.dims == std::vector<int64_t>{2, 3, 2});
    CHECK(a.data == px);
  }
  write_gz(dir / "labels.gz", encode_idx(idx_kind::labels, {0}, {}));
  idx_array empty = read_idx((dir / "labels.gz").string(), idx_kind::labels);
  CHECK(empty.dims == std::vector<int64_t>{0});
  CHECK(empty.data.empty());
  CHECK_THROWS_AS(encode_idx(idx_kind::labels, {3}, {1, 2}), std::invalid_argument);
}

TEST_CASE("core/idx_file: every malformed file is refused naming it") {
  scratch_dir dir("idx", "errors");
  const std::string good = encode_idx(idx_kind::images, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto err = [&](const std::string& name, const std::string& bytes, bool gz, idx_kind kind = idx_kind::images) {
    fs::path p = dir / name;
    gz ? write_gz(p, bytes) : write_file(p, bytes);
    std::string msg = error_of([&] { read_idx(p.string(), kind); });
    CHECK_MESSAGE(contains(msg, p.string()), msg);
    return msg;
  };
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    CHECK(contains(err("labels_as_images", encode_idx(idx_kind::labels, {1}, {0}), gz),
                   "is not an IDX image file (magic 0x00000801, expected 0x00000803)"));
    CHECK(contains(err("images_as_labels", good, gz, idx_kind::labels), "is not an IDX label file"));
    CHECK(contains(err("text", "hello world, no IDX here", gz), "is not an IDX image file (magic 0x68656c6c"));
    CHECK(contains(err("short_header", good.substr(0, 10), gz), "ends after 10 bytes, inside its 16-byte header"));
    CHECK(contains(err("truncated", good.substr(0, 21), gz), "ends after 21 of 24 bytes"));
    CHECK(contains(err("trailing", good + "xyz", gz), "has 3 bytes after the 8 bytes of data"));
    // A header claiming 2^48 bytes in a 16-byte file: refused before any allocation.
    CHECK(contains(err("huge", std::string("\0\0\x08\x03\0\x01\0\0\0\x01\0\0\0\x01\0\0", 16), gz),
                   "declares more than 2147483648 bytes"));
    CHECK(contains(err("zero_rows", encode_idx(idx_kind::images, {0, 0, 4}, {}), gz), "0x4 pixels"));
  }
  std::string missing = (dir / "absent.gz").string();
  std::string msg = error_of([&] { read_idx(missing, idx_kind::labels); });
  CHECK(contains(msg, "IDX file " + missing + " not found: install Debian's dataset-fashion-mnist"));

  // A damaged deflate stream or checksum is an error, never silently different pixels.
  write_gz(dir / "damaged.gz", good);
  std::string packed = fusion::test::read_file(dir / "damaged.gz");
  packed[packed.size() - 6] ^= 0x55;  // inside the CRC-32 of the gzip trailer
  write_file(dir / "damaged.gz", packed);
  msg = error_of([&] { read_idx((dir / "damaged.gz").string(), idx_kind::images); });
  CHECK_MESSAGE(contains(msg, (dir / "damaged.gz").string() + " cannot be read: damaged gzip data"), msg);
}

TEST_CASE("core/image_source: loads gzip'd and raw datasets and normalises with the training statistics") {
  for (bool gzip : {true, false}) {
    CAPTURE(gzip);
    scratch_dir dir("image_source", gzip ? "load_gz" : "load_raw");
    synthetic d;
    d.gzip = gzip;
    d.write(dir.path);
    image_source s(options_for(dir.path));
    CHECK(std::vector<int64_t>{s.train_count(), s.test_count(), s.height(), s.width(), s.classes()} ==
          std::vector<int64_t>{50, 20, 6, 5, 10});
    CHECK(s.feeds() == std::vector<std::string>{"images", "labels"});
    CHECK(std::string(s.item_name()) == "images");

    // Mean and population std of the training pixels in [0, 1], test pixels left out.
    const double n = 50.0 * 30;
    double sum = 0, sq = 0;
    for (uint8_t v : d.pixels(d.n_train, 0)) sum += v / 255.0, sq += (v / 255.0) * (v / 255.0);
    const double mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
    CHECK(s.pixel_mean() == doctest::Approx(mean).epsilon(1e-12));
    CHECK(s.pixel_std() == doctest::Approx(stddev).epsilon(1e-12));
    CHECK(s.normalised(0) == doctest::Approx(-mean / stddev));
    CHECK(s.normalised(255) == doctest::Approx((1 - mean) / stddev));
    CHECK(contains(s.describe(), dir.path.string() + ": 50 training and 20 test images of 6x5, 10 classes"));

    // Over one epoch the served training pixels have mean 0 and std 1.
    batch b(s, 10);
    double bs = 0, bsq = 0;
    for (uint64_t step = 0; step < 5; ++step) {
      s.train_batch(7, step, b.out());
      for (float x : b.images.f32_span()) bs += x, bsq += double(x) * x;
    }
    CHECK(bs / n == doctest::Approx(0).epsilon(1e-5));
    CHECK(std::sqrt(bsq / n) == doctest::Approx(1).epsilon(1e-5));
  }
}

TEST_CASE("core/image_source: a training batch depends only on (seed, step)") {
  scratch_dir dir("image_source", "reproducible");
  synthetic{}.write(dir.path);
  image_source a(options_for(dir.path, 2, true)), b(options_for(dir.path, 2, true));
  batch x(a, 8), y(b, 8);
  // b visits the steps in another order (and crosses epochs), so its permutation cache differs.
  for (uint64_t step : {9, 3, 0, 9}) {
    a.train_batch(42, step, x.out());
    b.train_batch(42, 17, y.out());
    b.train_batch(42, step, y.out());
    CHECK(max_rel_diff(x.images, y.images) == 0);
    CHECK(std::equal(x.labels.i32(), x.labels.i32() + 8, y.labels.i32()));
  }
  a.train_batch(42, 3, x.out());
  b.train_batch(42, 4, y.out());
  CHECK(max_rel_diff(x.images, y.images) > 0);
  b.train_batch(43, 3, y.out());
  CHECK(max_rel_diff(x.images, y.images) > 0);
}

TEST_CASE("core/image_source: every training image is visited exactly once per epoch") {
  scratch_dir dir("image_source", "epochs");
  synthetic d;
  d.n_train = 300;  // above 256, so both index bytes matter
  d.write(dir.path);
  image_source s(options_for(dir.path));
  const int64_t B = 7;  // does not divide 300: batches straddle epoch boundaries
  batch b(s, B);
  std::vector<int64_t> order;
  for (uint64_t step = 0; step < 3 * 300 / B + 1; ++step) {
    s.train_batch(5, step, b.out());
    for (int64_t r = 0; r < B; ++r) {
      int64_t idx = image_of(s, b.row_vec(r).data());
      CHECK(idx == s.train_index(5, step, B, r));
      CHECK(b.labels.i32()[r] == idx % 10);
      order.push_back(idx);
    }
  }
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    epochs.emplace_back(order.begin() + e * 300, order.begin() + (e + 1) * 300);
    std::vector<int64_t> sorted = epochs.back(), all(300);
    std::sort(sorted.begin(), sorted.end());
    std::iota(all.begin(), all.end(), 0);
    CHECK(sorted == all);
  }
  CHECK(epochs[0] != epochs[1]);  // reshuffled every epoch
  CHECK(epochs[1] != epochs[2]);
}

TEST_CASE("core/image_source: random crop and flip change images but keep labels") {
  scratch_dir dir("image_source", "augment");
  synthetic d;
  d.write(dir.path);
  const int pad = 2;
  image_source plain(options_for(dir.path)), aug(options_for(dir.path, pad, true));
  const auto px = d.pixels(d.n_train, 0);
  const int64_t B = 10;
  batch p(plain, B), a(aug, B);
  std::set<std::pair<int64_t, int64_t>> offsets;
  const int rows = 100;
  int flips = 0, changed = 0;
  for (uint64_t step = 0; step < rows / B; ++step) {
    plain.train_batch(3, step, p.out());
    aug.train_batch(3, step, a.out());
    for (int64_t r = 0; r < B; ++r) {
      int64_t idx = plain.train_index(3, step, B, r);
      CHECK(aug.train_index(3, step, B, r) == idx);  // same images, same order
      CHECK(a.labels.i32()[r] == p.labels.i32()[r]);
      CHECK(p.row_vec(r) == transformed(plain, px, idx, 0, 0, 0, false));
      if (a.row_vec(r) != p.row_vec(r)) ++changed;
      // The augmented row is one crop of the zero-padded image, maybe mirrored.
      int matches = 0;
      for (int64_t dy = 0; dy <= 2 * pad; ++dy)
        for (int64_t dx = 0; dx <= 2 * pad; ++dx)
          for (bool flip : {false, true})
            if (a.row_vec(r) == transformed(aug, px, idx, pad, dy, dx, flip)) {
              ++matches;
              offsets.insert({dy, dx});
              flips += flip;
            }
      CHECK(matches == 1);
    }
  }
  CHECK(changed > rows * 3 / 4);
  CHECK(offsets.size() > 10);  // of 25
  CHECK((flips > rows / 4 && flips < rows * 3 / 4));
  CHECK(contains(aug.describe(), "random crop (padding 2); random horizontal flip"));
}

TEST_CASE("core/image_source: evaluation batches are the test split in order, never augmented") {
  scratch_dir dir("image_source", "eval");
  synthetic d;
  d.write(dir.path);
  image_source s(options_for(dir.path, 2, true));
  const auto px = d.pixels(d.n_test, 99);
  CHECK(s.eval_batches(6) == 3);  // 20 test images: the last 2 are left out
  CHECK(s.eval_batches(21) == 0);
  CHECK_THROWS_AS(s.eval_batches(0), std::invalid_argument);
  batch b(s, 6);
  for (int64_t i = 0; i < 3; ++i) {
    s.eval_batch(i, b.out());
    for (int64_t r = 0; r < 6; ++r) {
      CHECK(b.labels.i32()[r] == (i * 6 + r) % 10);
      CHECK(b.row_vec(r) == transformed(s, px, i * 6 + r, 2, 2, 2, false));
    }
  }
  CHECK_THROWS_AS(s.eval_batch(3, b.out()), std::out_of_range);
  CHECK_THROWS_AS(s.eval_batch(-1, b.out()), std::out_of_range);
}

TEST_CASE("core/image_source: model inputs of another shape or type are refused") {
  scratch_dir dir("image_source", "inputs");
  synthetic{}.write(dir.path);
  image_source s(options_for(dir.path));
  CHECK_NOTHROW(s.check_input(0, "images", {8, 1, 6, 5}, dtype::f32));
  CHECK_NOTHROW(s.check_input(1, "labels", {8}, dtype::i32));
  CHECK(error_of([&] { s.check_input(0, "x", {8, 3, 32, 32}, dtype::f32); }) ==
        "model input 'x' is [8, 3, 32, 32] f32, but Fashion-MNIST images are [B, 1, 6, 5] f32");
  CHECK(contains(error_of([&] { s.check_input(0, "x", {8, 1, 6, 5}, dtype::i32); }), "is [8, 1, 6, 5] i32"));
  CHECK(error_of([&] { s.check_input(1, "y", {8, 10}, dtype::f32); }) ==
        "model input 'y' is [8, 10] f32, but Fashion-MNIST labels are [B] i32");
  CHECK_THROWS_AS(s.check_input(2, "z", {8}, dtype::i32), std::logic_error);
  tensor images({4, 1, 6, 5}, dtype::f32), labels({3}, dtype::i32);
  tensor* mismatched[2] = {&images, &labels};
  CHECK_THROWS_AS(s.train_batch(0, 0, mismatched), std::logic_error);
}

TEST_CASE("core/image_source: a missing or inconsistent dataset is refused naming the file") {
  scratch_dir dir("image_source", "errors");
  synthetic d;
  auto at = [&](const std::string& name) { return (dir / name).string(); };
  // The error of loading a fresh dataset after `change`, expecting `classes` classes.
  auto error_after = [&](auto change, int classes = 10) {
    fs::remove_all(dir.path);
    d.write(dir.path);
    change();
    image_options o = options_for(dir.path);
    o.classes = classes;
    return error_of([&] { image_source s(o); });
  };
  auto as_is = [] {};
  // Labels 0..9 written, 7 classes expected.
  CHECK(contains(error_after(as_is, 7), at("train-labels-idx1-ubyte.gz") +
                                            " is mislabelled: label 7 at index 7, expected 0..6"));

  // Each time one file replaced: labels for test images, cut short, one label short, another size.
  auto replace = [&](const std::string& name, const std::string& bytes) {
    return error_after([&] { write_gz(at(name), bytes); });
  };
  CHECK(contains(replace("t10k-images-idx3-ubyte.gz", encode_idx(idx_kind::labels, {20}, d.labels(20))),
                 at("t10k-images-idx3-ubyte.gz") + " is not an IDX image file (magic 0x00000801"));
  const std::string train = encode_idx(idx_kind::images, {50, 6, 5}, d.pixels(50, 0));
  CHECK(contains(replace("train-images-idx3-ubyte.gz", train.substr(0, 16 + 49 * 30)),
                 at("train-images-idx3-ubyte.gz") + " ends after 1486 of 1516 bytes"));
  CHECK(contains(replace("t10k-labels-idx1-ubyte.gz", encode_idx(idx_kind::labels, {19}, d.labels(19))),
                 at("t10k-labels-idx1-ubyte.gz") + " holds 19 labels, but " + at("t10k-images-idx3-ubyte.gz") +
                     " holds 20 images"));
  CHECK(contains(replace("t10k-images-idx3-ubyte.gz", encode_idx(idx_kind::images, {20, 5, 6}, d.pixels(20, 0))),
                 at("t10k-images-idx3-ubyte.gz") + " holds images of 5x6 pixels, but " +
                     at("train-images-idx3-ubyte.gz") + " holds 6x5"));
  // A missing file: the gzip'd name, the raw one and the package to install.
  CHECK(contains(error_after([&] { fs::remove(at("train-labels-idx1-ubyte.gz")); }),
                 "IDX file " + at("train-labels-idx1-ubyte.gz") + " not found (nor " + at("train-labels-idx1-ubyte") +
                     "): install Debian's dataset-fashion-mnist (scripts/setup.sh)"));

  // Options out of range, on a good dataset.
  error_after(as_is);
  CHECK_THROWS_AS(image_source(options_for(dir.path, 6)), std::invalid_argument);  // more than 5 columns
  CHECK_THROWS_AS(image_source(options_for(dir.path, -1)), std::invalid_argument);
  image_options o = options_for(dir.path);
  o.classes = 0;
  CHECK_THROWS_AS(image_source{o}, std::invalid_argument);
}

TEST_CASE("core/image_source: the real Fashion-MNIST of Debian's dataset-fashion-mnist") {
  image_options o;  // the default directory
  if (!fs::exists(fs::path(o.dir) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(o.dir) / "train-images-idx3-ubyte")) {
    MESSAGE("skipped: " << o.dir << " holds no Fashion-MNIST (install dataset-fashion-mnist: scripts/setup.sh)");
    return;
  }
  image_source s(o);
  CHECK(s.train_count() == 60000);
  CHECK(s.test_count() == 10000);
  CHECK(s.height() == 28);
  CHECK(s.width() == 28);
  CHECK(s.pixel_mean() == doctest::Approx(0.2860).epsilon(1e-3));
  CHECK(s.pixel_std() == doctest::Approx(0.3530).epsilon(1e-3));
  CHECK(s.eval_batches(64) == 156);
  // Ten balanced classes: every label of the test split in 0..9, each class 1000 times.
  batch b(s, 10000);
  s.eval_batch(0, b.out());
  std::vector<int> per_class(256);
  for (int64_t r = 0; r < 10000; ++r) ++per_class[static_cast<size_t>(b.labels.i32()[r])];
  CHECK(std::count(per_class.begin(), per_class.begin() + 10, 1000) == 10);  // so no label beyond 9
}
