// Image classification end to end: resnet-fmnist (a ResNet: branch and merge at every block,
// batch norm after every convolution) fed Fashion-MNIST through the image data source, in one
// process and across fusion-node processes.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "actors/trainer.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using fusion::test::src;

namespace {

const char* const fmnist_dir = "/usr/share/datasets/fashion-mnist";

// resnet-fmnist, batch 16 in `micro_batches`, augmentation on, two test batches per evaluation.
train_config fmnist_config(int64_t steps, int64_t micro_batches) {
  train_config c;
  c.model_file = src("configs/models/resnet-fmnist.pbtxt");
  c.image_dir = fmnist_dir;
  c.crop_padding = 2;
  c.flip = true;
  c.batch = 16;
  c.micro_batches = micro_batches;
  c.steps = steps;
  c.seed = 11;
  c.optim.lr = 3e-3;
  c.optim.min_lr = 3e-4;
  c.optim.warmup_steps = 2;
  c.optim.total_steps = 100;
  c.eval_batches = 2;
  c.progress = false;
  c.threads = 1;
  return c;
}

}  // namespace

TEST_CASE("image: resnet-fmnist trains, reports test accuracy, and resumes batch-norm statistics exactly") {
  const auto ckpt = fusion::test::temp_path("image", "resume.ckpt");
  // Reference: 6 uninterrupted steps.
  train_result full;
  eval_result full_eval;
  {
    session s(fmnist_config(6, 2));
    CHECK(s.item_name() == "images");
    CHECK_FALSE(s.is_text());
    full = s.train();
    full_eval = s.evaluate();
  }
  REQUIRE(full.steps.size() == 6);
  for (auto& st : full.steps) CHECK(std::isfinite(st.loss));
  // Throughput counts images: batch rows per second, not rows x some context.
  CHECK(full.steps.back().tokens_per_s > 0);
  CHECK(full.steps.back().tokens_per_s < 16 / full.steps.back().step_s * 1.01);
  REQUIRE(full.val_accuracies.size() == 1);
  CHECK(full.val_accuracies[0].second >= 0);
  CHECK(full.val_accuracies[0].second <= 1);
  // Test accuracy over 2 x 16 images is a multiple of 1/32.
  CHECK(std::abs(full.val_accuracies[0].second * 32 - std::round(full.val_accuracies[0].second * 32)) < 1e-9);
  CHECK(full_eval.accuracy == doctest::Approx(full.val_accuracies[0].second));
  // The same run in two halves through a checkpoint: parameters, Adam moments and the running
  // statistics travel, so the second half and the evaluation (which uses the running
  // statistics) are bit-identical.
  std::vector<double> halves;
  {
    auto c = fmnist_config(3, 2);
    c.checkpoint_file = ckpt;
    c.eval_batches = 0;
    session s(c);
    for (double l : losses_of(s.train())) halves.push_back(l);
  }
  eval_result resumed_eval;
  {
    auto c = fmnist_config(6, 2);
    c.resume_from = ckpt;
    session s(c);
    for (double l : losses_of(s.train())) halves.push_back(l);
    resumed_eval = s.evaluate();
  }
  CHECK(halves == losses_of(full));
  CHECK(resumed_eval.loss == full_eval.loss);
  CHECK(resumed_eval.accuracy == full_eval.accuracy);
  std::filesystem::remove(ckpt);
}

TEST_CASE("image: a model whose inputs do not match the dataset is refused before training") {
  const auto model = fusion::test::temp_path("image", "rgb.pbtxt");
  fusion::test::write_file(model, R"(name: "rgb"
input { name: "x" shape: "B,3,32,32" feed: "images" }
input { name: "y" shape: "B" dtype: I32 feed: "labels" }
node { name: "p" op: "global_avg_pool" in: "x" }
node { name: "fc" op: "linear" in: "p" attr { key: "out" value: "10" } }
node { name: "loss" op: "cross_entropy" in: "fc" in: "y" }
loss: "loss"
)");
  auto c = fmnist_config(1, 1);
  c.model_file = model;
  try {
    session s(c);
    FAIL("a 3x32x32 model trained on 1x28x28 images");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find("'x'") != std::string::npos);
    CHECK(what.find("[16, 3, 32, 32]") != std::string::npos);
  }
  auto d = fmnist_config(1, 1);
  d.image_dir = fusion::test::temp_path("image", "no-such-dir");
  CHECK_THROWS_WITH_AS(session{d}, doctest::Contains("no-such-dir"), std::runtime_error);
  std::filesystem::remove(model);
}

TEST_CASE("image: a ResNet over three node processes computes the losses of one process") {
  using namespace fusion::test::cluster;
  const double tolerance = 1e-6;  // float rounding only: the same kernels in the same order
  const auto reference = losses_of(session(fmnist_config(3, 2)).train());
  std::vector<child_process> nodes;
  auto c = fmnist_config(3, 2);
  on_nodes(c, write_cluster("resnet3", 3, "placement { policy: \"even\" }"), 3, nodes, "resnet3");
  train_result r;
  {
    session s(c);
    CHECK(s.cluster_nodes().size() == 3);
    r = s.train();
  }
  auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= tolerance * std::abs(reference[i]));
  // Blocks cut across nodes: activations and gradients crossed processes.
  CHECK_FALSE(r.steps.back().edges.empty());
}
