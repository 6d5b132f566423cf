// The token-data path end to end, as a user runs it: fusion-data train-bpe and tokenize on a
// slice of the corpus, then training on the shards (data.kind = tokens) through the operator
// actors: exact resume from a checkpoint, validation in bits per byte, sampling decoded to
// text, and the errors of a tokenizer that does not fit the model or the checkpoint.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "actors/trainer.hpp"
#include "core/data.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using namespace fusion::test;

namespace {

std::string fusion_data() { return std::string(FUSION_BINARY_DIR) + "/apps/fusion-data"; }

// gpt-char-tiny with a vocabulary of `vocab` tokens.
std::string model_with_vocab(const scratch_dir& d, int vocab) {
  std::string m = read_file(src("configs/models/gpt-char-tiny.pbtxt"));
  const std::string from = "const { name: \"V\"  value: 64 }";
  REQUIRE(m.find(from) != std::string::npos);
  m.replace(m.find(from), from.size(), "const { name: \"V\"  value: " + std::to_string(vocab) + " }");
  auto path = d / ("model-" + std::to_string(vocab) + ".pbtxt");
  write_file(path, m);
  return path.string();
}

// Tokenizer and shards of the first ~300 KB of the corpus, made with fusion-data.
struct token_data {
  scratch_dir dir{"tokens", "data"};
  token_data() {
    std::string text = read_text_file(src("data/kjv.txt"));
    text.resize(text.find('\n', 300000) + 1);
    write_file(dir / "corpus.txt", text);
    auto r = run_in(dir.path.string(), fusion_data() + " train-bpe corpus.txt --vocab-size 320 --out tok --threads 2");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("320 tokens") != std::string::npos);
    r = run_in(dir.path.string(), fusion_data() + " tokenize --tokenizer tok corpus.txt --out shards --val-fraction 0.1 "
                                                  "--shard-tokens 40000 --threads 2");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(std::filesystem::exists(dir / "shards/corpus_train_000001.bin"));
    CHECK(std::filesystem::exists(dir / "shards/corpus_val_000000.bin"));
    r = run_in(dir.path.string(), fusion_data() + " check shards --tokenizer tok");
    INFO(r.output);
    CHECK(r.status == 0);
  }
  train_config config(int64_t steps, int vocab = 320) {
    train_config c = tiny_train_config(steps, 2, 42);
    c.model_file = model_with_vocab(dir, vocab);
    c.data_kind = "tokens";
    c.shards_dir = (dir / "shards").string();
    c.tokenizer_dir = (dir / "tok").string();
    return c;
  }
};

}  // namespace

TEST_CASE("actors/token_train: shards from fusion-data train, resume exactly, report bits per byte and sample text") {
  token_data data;
  auto full_cfg = data.config(8);
  full_cfg.eval_batches = 2;
  std::vector<double> full;
  eval_result v;
  {
    session s(full_cfg);
    CHECK(s.describe_data().find("token shards") != std::string::npos);
    full = losses_of(s.train());
    v = s.evaluate();
    std::string sample = s.sample(12, "And God said", 0.8, 1);
    CHECK(!sample.empty());
  }
  REQUIRE(full.size() == 8);
  CHECK(std::isfinite(v.loss));
  // A BPE token covers several bytes: bits per byte are well below the loss in bits per token.
  CHECK(std::isfinite(v.bits_per_byte));
  CHECK(v.bits_per_byte < 0.6 * v.loss / std::log(2.0));
  CHECK(v.bits_per_byte > 0);

  const std::string ckpt = temp_path("tokens", "resume.ckpt");
  std::vector<double> resumed;
  {
    session first(data.config(4));
    for (double l : losses_of(first.train())) resumed.push_back(l);
    first.save_checkpoint(ckpt);
  }
  auto cfg = data.config(8);
  cfg.resume_from = ckpt;
  {
    session second(cfg);
    CHECK(second.step() == 4);
    for (double l : losses_of(second.train())) resumed.push_back(l);
  }
  REQUIRE(resumed.size() == full.size());
  for (size_t i = 0; i < full.size(); ++i) CHECK(resumed[i] == full[i]);  // the same windows, exactly

  // A checkpoint of another tokenizer is refused, naming the tokenizer.
  auto r = run_in(data.dir.path.string(), fusion_data() + " train-bpe corpus.txt --vocab-size 300 --out tok300");
  REQUIRE(r.status == 0);
  auto other = data.config(8);
  other.tokenizer_dir = (data.dir / "tok300").string();
  other.resume_from = ckpt;
  std::string msg;
  try {
    session s(other);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  CHECK(msg.find("another tokenizer") != std::string::npos);
  std::filesystem::remove(ckpt);

  // A tokenizer larger than the model's vocabulary is an error before training.
  msg.clear();
  try {
    session s(data.config(2, 300));
  } catch (const std::exception& e) {
    msg = e.what();
  }
  CHECK(msg.find("has 320 tokens but model") != std::string::npos);
}
