// fusion-train as a user runs it: config errors, help, a short run with metrics, sampling.
#include <doctest/doctest.h>

#include "tests/support/fixtures.hpp"
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using fusion::test::run_result;

// Runs fusion-train from the source directory with stderr merged into the captured output.
run_result run_train(const std::string& args) {
  return fusion::test::run_in_source(std::string(FUSION_BINARY_DIR) + "/apps/fusion-train " + args);
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = fusion::test::temp_path("app", name);
  std::ofstream(path) << text;
  return path;
}

// The config lives in /tmp: its relative paths would be relative to /tmp (docs/training.md, "Paths").
const char* base_ini = R"([model]
file=")" FUSION_SOURCE_DIR R"(/configs/models/gpt-char-tiny.pbtxt"
[train]
batch=8
micro-batches=2
steps=3
eval-batches=2
[output]
sample-chars=0
)";

}  // namespace

TEST_CASE("apps/fusion-train: --help lists the options and exits 0") {
  auto r = run_train("--help");
  CHECK(r.status == 0);
  CHECK(r.output.find("micro-batches") != std::string::npos);
  CHECK(r.output.find("--config") != std::string::npos);
}

TEST_CASE("apps/fusion-train: INI values CAF would silently ignore are reported with file and line") {
  auto path = write_temp("bad.ini", std::string(base_ini) + "[optim]\nlr=1\nlearning-rate=0.5\n");
  auto r = run_train("--config " + path);
  CHECK(r.status == 2);
  CHECK(r.output.find(path + ":11") != std::string::npos);  // lr=1: an integer for a real option
  CHECK(r.output.find(path + ":12") != std::string::npos);  // unknown key
  CHECK(r.output.find("learning-rate") != std::string::npos);
}

TEST_CASE("apps/fusion-train: missing files give clear errors") {
  auto r = run_train("--config /nonexistent/run.ini");
  CHECK(r.status != 0);
  CHECK(r.output.find("/nonexistent/run.ini") != std::string::npos);
  auto path = write_temp("ok.ini", base_ini);
  r = run_train("--config " + path + " --model configs/models/nope.pbtxt");
  CHECK(r.status != 0);
  CHECK(r.output.find("nope.pbtxt") != std::string::npos);
}

TEST_CASE("apps/fusion-train: a short run writes JSON-lines metrics and a checkpoint to sample from") {
  auto dir = std::filesystem::temp_directory_path() / ("fusion_app_run_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto metrics = (dir / "m.jsonl").string(), ckpt = (dir / "c.ckpt").string();
  auto path = write_temp("run.ini", base_ini);
  auto r = run_train("--config " + path + " --output.metrics=\\\"" + metrics + "\\\" --output.checkpoint=\\\"" +
                     ckpt + "\\\"");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("tok/s") != std::string::npos);
  std::ifstream in(metrics);
  std::string line;
  int steps = 0, vals = 0;
  while (std::getline(in, line)) {
    if (line.find("\"val_loss\"") != std::string::npos) ++vals;
    if (line.find("\"loss\"") != std::string::npos && line.find("\"tokens_per_s\"") != std::string::npos &&
        line.find("\"step\"") != std::string::npos)
      ++steps;
  }
  CHECK(steps == 3);
  CHECK(vals == 1);
  auto s = run_train("--config " + path + " --resume \"" + ckpt + "\" --sample 25 --prompt \"And\"");
  INFO(s.output);
  CHECK(s.status == 0);
  CHECK(s.output.find("And") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("apps/fusion-train: train.micro-batches = auto prints the choice and its predictions, bad values are refused") {
  std::string ini = base_ini;
  ini.replace(ini.find("micro-batches=2"), 15, "micro-batches=auto");
  auto path = write_temp("auto.ini", ini);
  auto r = run_train("--config " + path + " --train.steps=1 --output.metrics=\"\" --output.checkpoint=\"\"");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const size_t line = r.output.find("fusion-train: micro-batches ");
  REQUIRE(line != std::string::npos);
  const std::string said = r.output.substr(line, r.output.find('\n', line) - line);
  CHECK(said.find("(auto, one process, op times measured here") != std::string::npos);
  for (const char* m : {"M=1 ", "M=2 ", "M=4 ", "M=8 "}) CHECK(said.find(m) != std::string::npos);
  const int chosen = std::stoi(said.substr(std::string("fusion-train: micro-batches ").size()));
  CHECK(r.output.find("batch 8 in " + std::to_string(chosen) + " micro-batches") != std::string::npos);
  // The command line takes it too; a word other than auto is refused like any bad integer.
  auto bad = run_train("--config " + path + " --train.micro-batches=some");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("train.micro-batches") != std::string::npos);
  bad = run_train("--config " + path + " --train.micro-batches=3");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("divide train.batch (8), or be auto") != std::string::npos);
}

TEST_CASE("apps/fusion-train: Ctrl-C stops after the step in flight and keeps a resumable checkpoint") {
  auto dir = std::filesystem::temp_directory_path() / ("fusion_app_int_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto ckpt = (dir / "c.ckpt").string();
  auto path = write_temp("int.ini", base_ini);
  // The shell waits until the first progress line exists, then interrupts the run.
  std::string cmd = "--config " + path + " --train.steps=100000 --train.log-every=1 --output.checkpoint=" + ckpt +
                    " > " + (dir / "log").string() + " 2>&1 & pid=$!; "
                    "for i in $(seq 200); do grep -q 'step 2/' " + (dir / "log").string() +
                    " 2>/dev/null && break; sleep 0.1; done; kill -INT $pid; wait $pid; echo rc=$?";
  std::filesystem::create_directories(dir);
  auto r = run_train(cmd);
  INFO(r.output);
  CHECK(r.output.find("rc=130") != std::string::npos);
  REQUIRE(std::filesystem::exists(ckpt));
  auto s = run_train("--config " + path + " --resume " + ckpt + " --train.steps=100000 --sample 10");
  CHECK(s.status == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("apps/fusion-train: command-line mistakes name the option and suggest the right one") {
  auto path = write_temp("cli.ini", base_ini);
  auto r = run_train("--config " + path + " --train.stepz=5");
  CHECK(r.status == 2);
  CHECK(r.output.find("unknown option '--train.stepz'") != std::string::npos);
  CHECK(r.output.find("--train.steps") != std::string::npos);
  r = run_train("--config " + path + " --train.steps=abc");
  CHECK(r.status == 2);
  CHECK(r.output.find("--train.steps=abc") != std::string::npos);
}
