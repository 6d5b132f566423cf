// fusion-train's outputs as a user meets them (docs/training.md, "Checkpoints"): a re-run over an
// earlier run's checkpoints or metrics is refused until --resume=latest or --force says what to
// do, step-numbered checkpoints rotate to output.keep-checkpoints, a run killed with SIGKILL
// keeps a loadable latest checkpoint that --resume=latest continues, and the last lines name
// the checkpoint, the metrics and the plot.
#include <doctest/doctest.h>

#include "tests/support/fixtures.hpp"

#include <filesystem>
#include <string>

#include "core/checkpoint_dir.hpp"
#include "core/data.hpp"

namespace {

namespace fs = std::filesystem;
using fusion::test::read_file;
using fusion::test::run_in;
using fusion::test::src;
using fusion::test::write_file;

struct scratch_dir : fusion::test::scratch_dir {
  explicit scratch_dir(const std::string& name) : fusion::test::scratch_dir("outputs", name) {}
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string train_cmd() { return "timeout -k 5 300 " + std::string(FUSION_BINARY_DIR) + "/apps/fusion-train"; }

// gpt-char-tiny on 30 000 bytes of generated words, checkpoints in ck/ (2 kept), metrics m.jsonl.
void write_run(const scratch_dir& dir) {
  std::string text;
  uint64_t h = 4242;
  for (int i = 0; text.size() < 30000; ++i) {
    h = fusion::splitmix64(h);
    for (int k = 0; k < 2 + static_cast<int>(h % 7); ++k) text += static_cast<char>('a' + (h >> (8 + 5 * k)) % 26);
    text += i % 12 == 11 ? '\n' : ' ';
  }
  write_file(dir / "corpus.txt", text);
  write_file(dir / "run.ini", "[model]\nfile=\"" + src("configs/models/gpt-char-tiny.pbtxt") +
                                  "\"\n[data]\nfile=\"corpus.txt\"\n[train]\nbatch=8\nmicro-batches=2\nsteps=3\n"
                                  "eval-batches=0\n[output]\nsample-chars=0\ncheckpoint=\"ck\"\ncheckpoint-every=1\n"
                                  "keep-checkpoints=2\nmetrics=\"m.jsonl\"\n");
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("outputs: a re-run is refused, --resume=latest continues, --force starts over") {
  scratch_dir dir("rerun");
  write_run(dir);
  const std::string run = train_cmd() + " --config run.ini --runtime.quiet";
  auto r = run_in(dir.path.string(), run);
  INFO(r.output);
  REQUIRE(r.status == 0);
  // Step-numbered files, the newest two kept, and the last lines name where everything went.
  CHECK(fusion::list_checkpoints((dir / "ck").string()).size() == 2);
  CHECK(read_file(dir / "ck/latest") == "step-00000003.ckpt\n");
  CHECK(contains(r.output, "fusion-train: checkpoint: ck/step-00000003.ckpt (continue with --resume=latest)\n"
                           "fusion-train: metrics: m.jsonl\n"
                           "fusion-train: plot: scripts/plot.sh m.jsonl (draws m.png)\n"));
  const std::string metrics = read_file(dir / "m.jsonl"), latest = read_file(dir / "ck/step-00000003.ckpt");

  // The same command again: refused before loading anything, nothing touched.
  r = run_in(dir.path.string(), run);
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(contains(r.output, "fusion-train: an earlier run left checkpoints in ck (latest ck/step-00000003.ckpt) and "
                           "the metrics file m.jsonl: pass --resume=latest to continue it, --force to start over"));
  CHECK_FALSE(contains(r.output, "parameters"));
  CHECK(read_file(dir / "m.jsonl") == metrics);
  CHECK(read_file(dir / "ck/step-00000003.ckpt") == latest);
  // Only the metrics file left (checkpoints elsewhere): still refused.
  r = run_in(dir.path.string(), run + " --output.checkpoint=other");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "an earlier run left the metrics file m.jsonl"));

  // --resume=latest continues from step 3 and appends to the metrics.
  r = run_in(dir.path.string(), run + " --resume=latest --train.steps=5");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "resumed at step 3"));
  CHECK(read_file(dir / "ck/latest") == "step-00000005.ckpt\n");
  const std::string both = read_file(dir / "m.jsonl");
  CHECK(count(both, "\"type\":\"run\"") == 2);
  CHECK(contains(both, "\"first_step\":3"));
  CHECK(contains(both, "\"output.keep-checkpoints\":2"));
  // The same with the short form, a directory or its pointer file.
  r = run_in(dir.path.string(), run + " --resume ck --train.steps=6");
  CHECK(r.status == 0);
  r = run_in(dir.path.string(), run + " --resume ck/latest --train.steps=7");
  CHECK(r.status == 0);
  CHECK(contains(r.output, "resumed at step 6"));

  // --force: the old checkpoints and metrics are removed, and the run starts at step 0.
  r = run_in(dir.path.string(), run + " --force");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "--force: starting over"));
  CHECK_FALSE(contains(r.output, "resumed"));
  CHECK(count(read_file(dir / "m.jsonl"), "\"type\":\"run\"") == 1);
  auto steps = fusion::list_checkpoints((dir / "ck").string());
  REQUIRE(steps.size() == 2);
  CHECK(steps.back().first == 3);

  // Nothing to resume yet.
  r = run_in(dir.path.string(), run + " --output.checkpoint=empty --output.metrics= --resume=latest");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "nothing to resume: empty holds no checkpoint yet"));
}

TEST_CASE("outputs: a run killed with SIGKILL keeps a loadable latest checkpoint that --resume=latest continues") {
  scratch_dir dir("kill9");
  write_run(dir);
  // A long run checkpointing every step; killed once its fourth checkpoint is published (the
  // binary itself: a kill of the `timeout` wrapper would leave it running).
  auto r = run_in(dir.path.string(),
                  std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --config run.ini --train.steps=100000 --runtime.quiet > log 2>&1 & pid=$!; "
                                "for i in $(seq 600); do [ -f ck/step-00000004.ckpt ] && break; sleep 0.05; done; "
                                "kill -9 $pid; wait $pid; echo rc=$?; sleep 0.2");
  INFO(r.output << read_file(dir / "log"));
  CHECK(contains(r.output, "rc=137"));
  const std::string latest = fusion::latest_checkpoint((dir / "ck").string());
  REQUIRE_FALSE(latest.empty());
  fusion::checkpoint ck;
  REQUIRE_NOTHROW(ck = fusion::load_checkpoint(latest));
  CHECK(ck.step >= 4);
  auto all = fusion::list_checkpoints((dir / "ck").string());
  CHECK(all.size() >= 1);
  CHECK(all.size() <= 3);
  r = run_in(dir.path.string(), train_cmd() + " --config run.ini --runtime.quiet --resume=latest --train.steps=" +
                                    std::to_string(ck.step + 1));
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "resumed at step " + std::to_string(ck.step)));
}
