// End-to-end training through the operator actors: determinism, micro-batch invariance,
// learning, and checkpoint resume.
#include <doctest/doctest.h>

#include <cmath>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "actors/trainer.hpp"
#include "core/data.hpp"
#include "core/graph.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::losses_of;
using fusion::test::src;
using fusion::test::tiny_train_config;

namespace {

train_config tiny_config(int64_t steps, int64_t micro_batches) { return tiny_train_config(steps, micro_batches, 42); }

std::string temp_path(const std::string& name) { return fusion::test::temp_path("test", name); }

}  // namespace

TEST_CASE("actors/train: same seed and config give bit-identical losses") {
  auto a = losses_of(session(tiny_config(6, 2)).train());
  auto b = losses_of(session(tiny_config(6, 2)).train());
  REQUIRE(a.size() == 6);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);  // exact, not approximate
  CHECK(a.back() < a.front());
}

TEST_CASE("actors/train: a step's record times its optimizer update apart from the whole step") {
  const train_result r = session(tiny_config(3, 2)).train();
  REQUIRE(r.steps.size() == 3);
  for (const step_record& s : r.steps) {
    INFO("step " << s.step << ": step_s " << s.step_s << ", update_s " << s.update_s);
    CHECK(s.update_s > 0);
    CHECK(s.update_s < s.step_s);  // the forward and backward passes came first
  }
}

TEST_CASE("actors/train: micro-batch count does not change the math") {
  // Tolerance: float sums in a different order (per-micro-batch partial gradients) drift by
  // rounding only; 1e-4 relative over 6 steps is far below any real difference.
  auto m1 = losses_of(session(tiny_config(6, 1)).train());
  for (int64_t m : {2, 4, 8}) {
    auto mm = losses_of(session(tiny_config(6, m)).train());
    REQUIRE(mm.size() == m1.size());
    for (size_t i = 0; i < m1.size(); ++i) {
      INFO("micro-batches " << m << " step " << i + 1);
      CHECK(std::abs(mm[i] - m1[i]) <= 1e-4 * std::abs(m1[i]));
    }
  }
}

TEST_CASE("actors/train: checkpoint resume equals the uninterrupted run") {
  const std::string ckpt = temp_path("resume.ckpt");
  auto full = losses_of(session(tiny_config(8, 2)).train());
  std::vector<double> resumed;
  {
    session first(tiny_config(4, 2));
    for (double l : losses_of(first.train())) resumed.push_back(l);
    first.save_checkpoint(ckpt);
  }
  auto cfg = tiny_config(8, 2);
  cfg.resume_from = ckpt;
  session second(cfg);
  CHECK(second.step() == 4);
  for (double l : losses_of(second.train())) resumed.push_back(l);
  REQUIRE(resumed.size() == full.size());
  for (size_t i = 0; i < full.size(); ++i) CHECK(resumed[i] == full[i]);  // exact
  std::filesystem::remove(ckpt);
}

TEST_CASE("actors/train: tiny GPT beats the unigram entropy by 30%") {
  auto cfg = tiny_config(600, 2);
  cfg.batch = 16;
  cfg.optim.total_steps = 600;
  cfg.eval_batches = 16;
  session s(cfg);
  // The yardstick comes from the data: entropy of the training split's character distribution.
  char_tokenizer tok;
  std::string text = read_text_file(cfg.data_file);
  tok.build(text);
  auto ids = tok.encode(text);
  text_dataset ds(ids, cfg.val_fraction);
  double entropy = unigram_entropy(ds.train_tokens(), tok.size());
  CHECK(entropy == doctest::Approx(s.unigram_entropy()));
  train_result r = s.train();
  REQUIRE(!r.val_losses.empty());
  double val = r.val_losses.back().second;
  MESSAGE("unigram entropy " << entropy << " nats, validation loss after 600 steps " << val);
  CHECK(val < 0.7 * entropy);
}

TEST_CASE("actors/train: sampling from a trained model produces corpus characters") {
  session s(tiny_config(20, 1));
  s.train();
  std::string text = s.sample(40, "And God", 0.8, 1);
  CHECK(text.size() == 40);
  char_tokenizer tok;
  tok.build(read_text_file(src("data/kjv.txt")));
  CHECK_NOTHROW(tok.encode(text));
}

TEST_CASE("actors/train: bad configuration is an error, not a crash") {
  auto cfg = tiny_config(2, 3);  // 3 does not divide batch 8
  CHECK_THROWS_WITH_AS(session{cfg}, doctest::Contains("micro-batches"), std::runtime_error);
  cfg = tiny_config(2, 1);
  cfg.model_file = src("configs/models/no-such-model.pbtxt");
  CHECK_THROWS_AS(session{cfg}, std::exception);
  cfg = tiny_config(2, 1);
  cfg.resume_from = temp_path("missing.ckpt");
  CHECK_THROWS_WITH_AS(session{cfg}, doctest::Contains("missing.ckpt"), std::runtime_error);
}

TEST_CASE("actors/train: SGD with momentum trains too") {
  auto cfg = tiny_config(30, 2);
  cfg.optim.kind = "sgd";
  cfg.optim.lr = 0.3;
  cfg.optim.min_lr = 0.03;
  auto losses = losses_of(session(cfg).train());
  REQUIRE(losses.size() == 30);
  CHECK(losses.back() < losses.front() - 0.3);
}

TEST_CASE("actors/train: an operator failing inside its actor stops the run with its name") {
  // The embedding accepts 40 ids while the corpus has 63 characters: the 'wte' actor meets an
  // out-of-range id, reports it instead of crashing, and the coordinator raises it.
  std::string text = read_text_file(src("configs/models/gpt-char-tiny.pbtxt"));
  auto at = text.find("attr { key: \"vocab\" value: \"V\" }");
  REQUIRE(at != std::string::npos);
  text.replace(at, 33, "attr { key: \"vocab\" value: \"40\" }");
  const std::string model = temp_path("narrow.pbtxt");
  { std::ofstream(model) << text; }
  auto cfg = tiny_config(3, 2);
  cfg.model_file = model;
  session s(cfg);
  CHECK_THROWS_WITH_AS(s.train(), doctest::Contains("op actor 'wte' failed"), std::runtime_error);
  std::filesystem::remove(model);
}

TEST_CASE("actors/train: activations and gradients move between local actors, only fan-out copies") {
  auto cfg = tiny_config(2, 2);
  graph g = load_graph(cfg.model_file, cfg.batch / cfg.micro_batches);
  uint64_t fan_out = 0;  // extra consumers per node: each costs one copy per micro-batch
  for (auto& n : g.nodes)
    if (n.consumers.size() > 1) fan_out += n.consumers.size() - 1;
  REQUIRE(fan_out > 0);  // the residual stream fans out, so the test means something
  session s(cfg);
  uint64_t before = tensor::copies();
  s.train();
  CHECK(tensor::copies() - before == fan_out * static_cast<uint64_t>(cfg.micro_batches * cfg.steps));
}
