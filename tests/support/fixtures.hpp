// Shared fixtures of the end-to-end tests: paths, the tiny GPT training config, loss lists and
// running a command from the source directory.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "actors/trainer.hpp"

namespace fusion::test {

/// A path inside the source tree.
inline std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

/// A per-process temporary file name: /tmp/fusion_PREFIX_PID_NAME.
inline std::string temp_path(const std::string& prefix, const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("fusion_" + prefix + "_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

/// gpt-char-tiny on the corpus, batch 8, no evaluation, no progress output.
inline train_config tiny_train_config(int64_t steps, int64_t micro_batches, uint64_t seed) {
  train_config c;
  c.model_file = src("configs/models/gpt-char-tiny.pbtxt");
  c.data_file = src("data/kjv.txt");
  c.batch = 8;
  c.micro_batches = micro_batches;
  c.steps = steps;
  c.seed = seed;
  c.optim.lr = 3e-3;
  c.optim.min_lr = 3e-4;
  c.optim.warmup_steps = 5;
  c.optim.total_steps = 300;
  c.eval_batches = 0;
  c.progress = false;
  return c;
}

/// The training loss of every step.
inline std::vector<double> losses_of(const train_result& r) {
  std::vector<double> out;
  for (auto& s : r.steps) out.push_back(s.loss);
  return out;
}

/// Exit status and merged stdout/stderr of a shell command.
struct run_result {
  int status = -1;
  std::string output;
};

/// Runs `command` with sh in directory `cwd`, stderr merged into the output.
inline run_result run_in(const std::string& cwd, const std::string& command) {
  std::string cmd = "cd '" + cwd + "' && " + command + " 2>&1";
  run_result r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Runs `command` with sh from the source directory, stderr merged into the output.
inline run_result run_in_source(const std::string& command) { return run_in(FUSION_SOURCE_DIR, command); }

/// A per-test directory under /tmp (temp_path(group, name)), emptied when made and removed at
/// the end; owner permissions are restored first, so a test may make it read-only.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir(const std::string& group, const std::string& name) : path(temp_path(group, name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& rel) const { return path / rel; }
};

/// Writes `text` to `p`, creating its directories.
inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

/// The whole of `p` ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace fusion::test
