// fusion-train's checks before training, as a new user meets them: meaningless settings and an
// unwritable output.checkpoint are usage errors (exit 2); a validation split too short for one
// batch stops the run before its first step; a diverged run never writes NaN or infinity into
// its checkpoint and says which checkpoint is the last good state.
#include <doctest/doctest.h>

#include "tests/support/fixtures.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/checkpoint.hpp"
#include "core/data.hpp"
#include "ops/optim.hpp"

namespace {

namespace fs = std::filesystem;
using fusion::test::run_result;
using fusion::test::read_file;
using fusion::test::src;
using fusion::test::write_file;
// A per-test directory of this file's group.
struct scratch_dir : fusion::test::scratch_dir {
  explicit scratch_dir(const std::string& name) : fusion::test::scratch_dir("settings", name) {}
};

// The program for a shell command line, stopped (TERM, then KILL) should it ever hang.
std::string train_cmd() { return "timeout -k 5 300 " + std::string(FUSION_BINARY_DIR) + "/apps/fusion-train"; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }




// About 30 000 bytes of lower-case words: a corpus for gpt-char-tiny (context 64, vocabulary 64).
std::string corpus_text() {
  std::string out;
  uint64_t h = 777;
  for (int i = 0; out.size() < 30000; ++i) {
    h = fusion::splitmix64(h);
    int len = 2 + static_cast<int>(h % 7);
    for (int k = 0; k < len; ++k) out += static_cast<char>('a' + (h >> (8 + 5 * k)) % 26);
    out += i % 12 == 11 ? '\n' : ' ';
  }
  return out;
}

// A run config in `dir`: gpt-char-tiny on corpus.txt, batch 8 in 2 micro-batches, no sample.
void write_run_ini(const scratch_dir& dir) {
  write_file(dir / "corpus.txt", corpus_text());
  write_file(dir / "run.ini", "[model]\nfile=\"" + src("configs/models/gpt-char-tiny.pbtxt") +
                                  "\"\n[data]\nfile=\"corpus.txt\"\n[train]\nbatch=8\nmicro-batches=2\nsteps=2\n"
                                  "[output]\nsample-chars=0\n");
}

// The step N of "... the checkpoint of step N in FILE is the last good state", or -1.
long long last_good_step(const std::string& output, const std::string& file) {
  std::smatch m;
  std::regex re("the checkpoint of step (\\d+) in " + std::regex_replace(file, std::regex(R"([.^$|()\[\]{}*+?\\])"),
                                                                          R"(\$&)") +
                " is the last good state");
  return std::regex_search(output, m, re) ? std::stoll(m[1].str()) : -1;
}

}  // namespace

TEST_CASE("settings: meaningless values are usage errors that name the setting, before anything loads") {
  scratch_dir dir("usage");
  write_run_ini(dir);
  struct mistake {
    std::string args;
    std::string says;
  };
  const mistake mistakes[] = {
      {"--optim.grad-clip=-1.0", "optim.grad-clip must be >= 0 (0 turns clipping off), got -1"},
      {"--optim.lr=1.0e-4 --optim.min-lr=1.0e-3", "optim.min-lr must not be above optim.lr"},
      {"--train.eval-batches=-1", "train.eval-batches must be at least 0 (0: no validation), got -1"},
      {"--train.eval-every=-5", "train.eval-every must be at least 0"},
      {"--output.checkpoint-every=-2", "output.checkpoint-every must be at least 0"},
      {"--output.sample-chars=-10", "output.sample-chars must be 0 (none) to 100000, got -10"},
      {"--sample.temperature=-0.5", "sample.temperature must be at least 0 (0: greedy), got -0.5"},
      {"--sample.count=-3", "sample.count must be 0 to 100000, got -3"},
      // Once truncated to an int: 4294967297 sampled 1 character, 2147483648 ran until killed.
      {"--output.sample-chars=999999999999", "output.sample-chars must be 0 (none) to 100000, got 999999999999"},
      {"--sample.count=4294967297", "sample.count must be 0 to 100000, got 4294967297"},
      {"--train.log-every=0", "train.log-every must be at least 1 step, got 0"},
      // Beyond 2^63 ns a deadline wrapped around: the first step timed out at once, in CAF's words.
      {"--runtime.step-timeout=1.0e10", "runtime.step-timeout must be more than 0 and at most 1000000 seconds, got"},
      {"--runtime.stop-grace=-1.0", "runtime.stop-grace must be 0 to 1000000 seconds, got -1"},
      // Every thread is started before the run: 99999999999 ate all memory, 4294967297 became 1.
      {"--runtime.threads=99999999999", "--runtime.threads=99999999999: must be at most 1024"},
      {"--runtime.blas-threads=4294967297", "--runtime.blas-threads=4294967297: must be at most 1024"},
      // 1e400 overflows to inf on the way in (a literal inf is refused by the parser).
      {"--optim.lr=1.0e400", "--optim.lr: must be a finite number"},
      {"--sample.temperature=1.0e400", "--sample.temperature: must be a finite number"},
      // CAF's own options are not ours to pass on: scheduler.max-threads would bypass runtime.threads.
      {"--scheduler.max-threads=99999999999", "unknown option '--scheduler.max-threads'"},
      {"--logger.verbosity=bogus", "unknown option '--logger.verbosity'"},
      {"--train.schedule=zigzag", "train.schedule must be eager, gpipe, 1f1b or auto, got \"zigzag\""},
      {"--data.val-fraction=0.0", "train.eval-batches is 8 but data.val-fraction is 0"},
      {"--train.allreduce=f8", "train.allreduce must be f32 or f16, got \"f8\""},
      {"--train.allreduce=bf16", "train.allreduce must be f32 or f16, got \"bf16\""},
      {"--train.sync=local:0", "train.sync must be step or local:H with H a whole number of steps >= 1, got \"local:0\""},
      {"--train.sync=every", "train.sync must be step or local:H"},
      {"--train.sync=local:4 --train.outer-lr=0.0", "train.outer-lr must be > 0, got 0"},
      {"--train.outer-momentum=1.5", "train.outer-momentum must be in [0, 1), got 1.5"},
      {"--flow.window=5000", "flow.window must be at most 64 chunks in flight per edge"},
  };
  for (auto& m : mistakes) {
    auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini " + m.args);
    INFO(m.args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, m.says));
    CHECK_FALSE(contains(r.output, "parameters"));  // stopped before the model was loaded
    for (const char* internal : {"grad_clip", "min_lr", "eval_batches", "after_training", "std::"})
      CHECK_FALSE(contains(r.output, internal));
  }
  // What to change is said, too.
  auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --data.val-fraction=0.0");
  CHECK(contains(r.output, "set train.eval-batches=0"));
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --optim.lr=5.0e-5");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "got 0.0001 above 5e-05"));  // the default optim.min-lr is above this lr
  // The limits themselves are fine: no clipping, greedy sampling, no validation text at all.
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --optim.grad-clip=0.0 "
                                                            "--sample.temperature=0.0 --data.val-fraction=0.0 "
                                                            "--train.eval-batches=0 --output.checkpoint=c.ckpt");
  INFO(r.output);
  CHECK(r.status == 0);
  REQUIRE(fs::exists(dir / "c.ckpt"));
  // Sampling never evaluates: a corpus without validation text does not stop it.
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --data.val-fraction=0.0 "
                                                            "--resume c.ckpt --sample 5");
  INFO(r.output);
  CHECK(r.status == 0);
}

TEST_CASE("settings: a config file with Windows line endings reads as without one, a directory is no config file") {
  scratch_dir dir("crlf");
  write_run_ini(dir);
  std::string crlf;
  for (char c : read_file(dir / "run.ini")) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write_file(dir / "crlf.ini", crlf);
  // Once: "fusion-train: bad command line (see --help)", naming neither the file nor a line.
  auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config crlf.ini");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "2 steps in"));
  // Once read as an empty config: "no model file".
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config " + dir.path.string());
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(contains(r.output, "config file '" + dir.path.string() + "' is a directory"));
}

TEST_CASE("settings: fusion-node's waits are bounded: a join-timeout of -1 or 1e7 s is refused, naming the key") {
  const std::string node = "timeout -k 5 60 " + std::string(FUSION_BINARY_DIR) +
                           "/apps/fusion-node --config configs/nodes/site-a.ini --node.name=n9 "
                           "--node.coordinator=127.0.0.1:1 --security.mode=off ";
  const std::pair<std::string, std::string> mistakes[] = {
      // Once: "within -1 s", and 1e400 (inf) waited for ever.
      {"--node.join-timeout=-1.0", "node.join-timeout must be more than 0 and at most 1000000 seconds, got -1"},
      {"--node.join-timeout=1.0e400", "--node.join-timeout: must be a finite number"},
      {"--cluster.rejoin-timeout=1.0e7", "cluster.rejoin-timeout must be 0 (off) or more and at most 1000000 seconds"},
      {"--runtime.threads=5000", "--runtime.threads=5000: must be at most 1024"},
  };
  for (auto& [args, says] : mistakes) {
    auto r = fusion::test::run_in_source(node + args);
    INFO(args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, says));
  }
}

TEST_CASE("settings: optim.grad-clip below 0 and optim.min-lr above optim.lr are refused by check_optim_config") {
  auto message = [](fusion::optim_config c) {
    try {
      fusion::check_optim_config(c);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  fusion::optim_config c;
  CHECK(message(c).empty());
  c.grad_clip = 0;
  CHECK(message(c).empty());
  c.grad_clip = -1;
  CHECK(message(c).rfind("optim.grad-clip", 0) == 0);
  c = {};
  c.min_lr = c.lr;
  CHECK(message(c).empty());
  c.min_lr = 2 * c.lr;
  CHECK(message(c).rfind("optim.min-lr", 0) == 0);
  c = {};
  c.lr = 0;
  c.min_lr = 0;
  CHECK(message(c).empty());  // a frozen run is allowed
}

TEST_CASE("settings: an output.checkpoint or output.metrics that cannot be written is refused before training") {
  scratch_dir dir("ckpt");
  write_run_ini(dir);
  fs::create_directories(dir / "out/x.ckpt");
  write_file(dir / "plain.txt", "not a directory\n");
  struct bad_path {
    std::string option;
    std::string path;
    std::string says;
  };
  std::vector<bad_path> bad = {
      {"output.checkpoint", "out/x.ckpt", "output.checkpoint: out/x.ckpt is a directory: name a file in it, e.g. out/x.ckpt/model.ckpt"},
      {"output.checkpoint", "plain.txt",
       "output.checkpoint: plain.txt is a file, not a checkpoint directory: name a directory (or a file ending in .ckpt)"},
      {"output.checkpoint", "plain.txt/c.ckpt",
       "output.checkpoint: plain.txt/c.ckpt cannot be written: plain.txt is not a directory"},
      {"output.checkpoint", "plain.txt/sub/c.ckpt", "plain.txt is not a directory"},
      {"output.checkpoint", "plain.txt/sub", "output.checkpoint: plain.txt/sub cannot be written: plain.txt is not a directory"},
      {"output.metrics", "out", "output.metrics: out is a directory: name a file in it, e.g. out/metrics.jsonl"},
      {"output.metrics", "plain.txt/m.jsonl", "output.metrics: plain.txt/m.jsonl cannot be written: plain.txt is not a directory"},
  };
  // Permission bits do not stop root: the unwritable directory is checked for other users only.
  if (::geteuid() != 0) {
    fs::create_directories(dir / "locked");
    fs::permissions(dir / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    bad.push_back({"output.checkpoint", "locked/c.ckpt", "directory locked is not writable"});
    bad.push_back({"output.metrics", "locked/m.jsonl", "directory locked is not writable"});
  }
  for (auto& b : bad) {
    auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --" + b.option + "=" + b.path);
    INFO(b.option << "=" << b.path << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, b.says));
    CHECK_FALSE(contains(r.output, "step 1/"));  // before training
  }
  CHECK(read_file(dir / "plain.txt") == "not a directory\n");
  // The check neither creates nor truncates the checkpoint file (here another mistake stops the run).
  write_file(dir / "old.ckpt", "old");
  auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --output.checkpoint=old.ckpt "
                                                                 "--optim.grad-clip=-1.0");
  CHECK(r.status == 2);
  CHECK(read_file(dir / "old.ckpt") == "old");
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --output.checkpoint=new/sub/c.ckpt "
                                                            "--optim.grad-clip=-1.0");
  CHECK(r.status == 2);
  CHECK_FALSE(fs::exists(dir / "new"));
  // Missing directories are still created by the run.
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --train.eval-batches=0 "
                                                            "--output.checkpoint=new/sub/c.ckpt");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(fs::exists(dir / "new/sub/c.ckpt"));
}

TEST_CASE("settings: a validation split too short for one batch stops the run before its first step") {
  scratch_dir dir("val");
  write_run_ini(dir);
  // 30 000 characters x 0.01 = 300 validation tokens; one batch of 8 x 64 needs 513.
  auto r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --data.val-fraction=0.01 "
                                                                 "--train.eval-batches=2 --output.checkpoint=c.ckpt");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(contains(r.output, "corpus corpus.txt: validation split has 300 tokens"));
  CHECK(contains(r.output, "raise data.val-fraction or lower train.batch, or set train.eval-batches=0"));
  CHECK_FALSE(contains(r.output, "step 1/"));
  CHECK_FALSE(fs::exists(dir / "c.ckpt"));
  // Enough validation text for the batch: trains, evaluates and saves.
  r = fusion::test::run_in(dir.path.string(), train_cmd() + " --config run.ini --data.val-fraction=0.05 "
                                                            "--train.eval-batches=2 --output.checkpoint=c.ckpt");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "val_loss"));
  CHECK(fs::exists(dir / "c.ckpt"));
}

TEST_CASE("settings: save_checkpoint refuses NaN and infinity and leaves the old file") {
  scratch_dir dir("nan");
  const std::string path = (dir / "c.ckpt").string();
  fusion::checkpoint good;
  good.step = 7;
  good.model_name = "m";
  good.tensors.emplace_back("a/w", fusion::tensor::from({3}, std::vector<float>{1, 2, 3}));
  good.tensors.emplace_back("@ids", fusion::tensor::from_i32({2}, std::vector<int32_t>{-1, 5}));
  CHECK_FALSE(fusion::first_non_finite(good));
  fusion::save_checkpoint(path, good);
  const std::string before = read_file(path);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    fusion::checkpoint ck = good;
    ck.step = 8;
    ck.tensors.emplace_back("b/m", fusion::tensor::from({2}, std::vector<float>{0, bad}));
    CHECK(fusion::first_non_finite(ck) == "b/m");
    CHECK_THROWS_WITH_AS(fusion::save_checkpoint(path, ck), doctest::Contains("\"b/m\" holds NaN or infinity"),
                         std::invalid_argument);
    CHECK(read_file(path) == before);
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  fusion::checkpoint f64 = good;
  fusion::tensor d({2}, fusion::dtype::f64);
  d.f64()[1] = std::nan("");
  f64.tensors.emplace_back("d", std::move(d));
  CHECK(fusion::first_non_finite(f64) == "d");
}

TEST_CASE("settings: a diverged run keeps its last good checkpoint and says which step it holds") {
  if (!fs::exists(src("data/kjv.txt"))) {
    MESSAGE("skipped: data/kjv.txt not present (scripts/get-data.sh writes it)");
    return;
  }
  scratch_dir dir("diverge");
  const std::string ckpt = (dir / "c.ckpt").string();
  const std::string run = train_cmd() + " --config configs/runs/char-tiny.ini --train.batch=8 --train.eval-batches=0"
                                        " --output.sample-chars=0 --output.metrics= --output.checkpoint=" + ckpt;
  auto check_file = [&](long long step) {
    fusion::checkpoint ck;
    REQUIRE_NOTHROW(ck = fusion::load_checkpoint(ckpt));
    CHECK(ck.step == static_cast<uint64_t>(step));
    CHECK_FALSE(fusion::first_non_finite(ck));
  };
  SUBCASE("the loss becomes non-finite") {
    // No clipping and a huge learning rate: the loss explodes within a few steps.
    auto r = fusion::test::run_in_source(run + " --train.steps=100 --output.checkpoint-every=1 --optim.lr=1.0e6"
                                               " --optim.grad-clip=0.0");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK_FALSE(contains(r.output, "unaffected"));
    CHECK(contains(r.output, "learning rate too high?"));
    const long long good = last_good_step(r.output, ckpt);
    CHECK(good >= 1);
    CHECK(contains(r.output, "(last checkpoint:") == false);  // said once, in the message itself
    // "the loss became nan at step good+1" or, when an update broke the parameters first,
    // "the parameters were no longer finite after step good+1 ... and were not saved": either
    // way the step after the last good checkpoint.
    const bool at_next_step = (contains(r.output, "became") && contains(r.output, "at step " + std::to_string(good + 1))) ||
                              contains(r.output, "after step " + std::to_string(good + 1));
    CHECK(at_next_step);
    check_file(good);
  }
  SUBCASE("an update makes the parameters non-finite while the loss is still finite") {
    auto r = fusion::test::run_in_source(run + " --train.steps=2");
    INFO(r.output);
    REQUIRE(r.status == 0);
    const std::string before = read_file(ckpt);
    // A learning rate beyond float range: step 3's loss is finite (computed from the good
    // parameters of step 2), its update is not; the checkpoint of step 3 is refused.
    r = fusion::test::run_in_source(run + " --resume " + ckpt + " --train.steps=5 --output.checkpoint-every=1"
                                          " --optim.lr=1.0e300");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "the parameters were no longer finite after step 3"));
    CHECK(contains(r.output, "and were not saved (learning rate too high?"));
    CHECK(contains(r.output, "no checkpoint was written in this run; " + ckpt + " is left as it was"));
    CHECK(read_file(ckpt) == before);
    check_file(2);
  }
}
