// A run's checkpoint directory (core/checkpoint_dir.hpp): step-numbered files, the `latest`
// pointer, keep-N rotation, and a writer killed with SIGKILL at random instants that must
// never leave fewer than one loadable checkpoint.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/checkpoint_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace fusion;

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("fusion_ckdir_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

checkpoint make_ckpt(uint64_t step, int64_t floats = 16) {
  checkpoint ck;
  ck.step = step;
  ck.model_name = "m";
  std::vector<float> v(static_cast<size_t>(floats), static_cast<float>(step));
  ck.tensors.emplace_back("a/w", tensor::from({floats}, v));
  return ck;
}

std::vector<uint64_t> steps_in(const std::string& dir) {
  std::vector<uint64_t> out;
  for (auto& [step, path] : list_checkpoints(dir)) out.push_back(step);
  return out;
}

}  // namespace

TEST_CASE("checkpoint dir: step-numbered files, a latest pointer and the newest N kept") {
  temp_dir t("keep");
  const std::string dir = (t.path / "ck").string();
  CHECK(latest_checkpoint(dir).empty());
  CHECK(list_checkpoints(dir).empty());
  CHECK(checkpoint_file_name(100) == "step-00000100.ckpt");
  for (uint64_t s : {10, 20, 30, 40}) {
    std::string written = save_checkpoint_to(dir, make_ckpt(s), 2);
    CHECK(written == dir + "/" + checkpoint_file_name(s));
    CHECK(latest_checkpoint(dir) == written);
  }
  CHECK(steps_in(dir) == std::vector<uint64_t>{30, 40});
  std::ifstream in(dir + "/latest");
  std::string line;
  std::getline(in, line);
  CHECK(line == "step-00000040.ckpt");
  CHECK(load_checkpoint(latest_checkpoint(dir)).step == 40);
  // keep 0 keeps everything.
  save_checkpoint_to(dir, make_ckpt(50), 0);
  CHECK(steps_in(dir) == std::vector<uint64_t>{30, 40, 50});
  // A missing pointer falls back to the highest step; a pointer outside the directory is ignored.
  fs::remove(dir + "/latest");
  CHECK(latest_checkpoint(dir) == dir + "/step-00000050.ckpt");
  std::ofstream(dir + "/latest") << "../../etc/passwd\n";
  CHECK(latest_checkpoint(dir) == dir + "/step-00000050.ckpt");
  // Names that are not step files are neither listed nor removed.
  std::ofstream(dir + "/notes.txt") << "mine";
  std::ofstream(dir + "/step-00000060.ckpt.tmp") << "partial";
  CHECK(steps_in(dir) == std::vector<uint64_t>{30, 40, 50});
  CHECK(remove_checkpoints(dir) == 5);  // three step files, latest, the temporary file
  CHECK(list_checkpoints(dir).empty());
  CHECK(fs::exists(dir + "/notes.txt"));
  CHECK_FALSE(fs::exists(dir + "/step-00000060.ckpt.tmp"));
}

TEST_CASE("checkpoint dir: a name ending in .ckpt is one file, replaced by every save") {
  temp_dir t("file");
  const std::string file = (t.path / "sub/model.ckpt").string();
  CHECK(names_checkpoint_file(file));
  CHECK_FALSE(names_checkpoint_file((t.path / "checkpoints").string()));
  fs::create_directories(t.path / "sub");
  CHECK(save_checkpoint_to(file, make_ckpt(1), 2) == file);
  CHECK(save_checkpoint_to(file, make_ckpt(2), 2) == file);
  CHECK(latest_checkpoint(file) == file);
  CHECK(load_checkpoint(file).step == 2);
  CHECK(remove_checkpoints(file) == 1);
  CHECK(latest_checkpoint(file).empty());
}

TEST_CASE("checkpoint dir: a writer killed with SIGKILL at random instants leaves a loadable latest") {
  temp_dir t("kill");
  const std::string dir = (t.path / "ck").string();
  std::mt19937 rng(12345);
  uint64_t next = 1;
  constexpr int64_t keep = 2;
  for (int round = 0; round < 25; ++round) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // The child saves 256 KiB checkpoints as fast as it can until it is killed.
      for (uint64_t s = next;; ++s) save_checkpoint_to(dir, make_ckpt(s, 64 << 10), keep);
    }
    // Kill only once this round's first checkpoint is published, then at a random instant.
    const std::string first = dir + "/" + checkpoint_file_name(next);
    for (int i = 0; i < 2000 && latest_checkpoint(dir) != first; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    INFO("round " << round);
    const std::string latest = latest_checkpoint(dir);
    REQUIRE_FALSE(latest.empty());
    checkpoint ck;
    REQUIRE_NOTHROW(ck = load_checkpoint(latest));
    CHECK(ck.tensors[0].second.f32()[0] == static_cast<float>(ck.step));
    auto all = list_checkpoints(dir);
    std::string listed;
    for (auto& [step, path] : all) listed += std::to_string(step) + " ";
    INFO("files: " << listed << "latest: " << latest << " status " << status);
    // A kill between publishing a file and removing the oldest leaves more, never fewer.
    CHECK(all.size() >= 1);
    // `latest` names the newest file, or the one before when the kill fell between the newest
    // file's rename and the pointer's.
    CHECK((all.back().second == latest || (all.size() >= 2 && all[all.size() - 2].second == latest)));
    for (auto& [step, path] : all) CHECK_NOTHROW(load_checkpoint(path));
    next = all.back().first + 1;
  }
  // The next save that completes removes what the killed ones left beyond `keep`.
  save_checkpoint_to(dir, make_ckpt(next), keep);
  CHECK(list_checkpoints(dir).size() == static_cast<size_t>(keep));
  CHECK(load_checkpoint(latest_checkpoint(dir)).step == next);
}
