// Asking for a GPU where there is none: fusion-train and fusion-node stop at once with a message
// that names the device, and exit 2 (a setting to change, docs/training.md "Exit status"). These run
// on the GPU-less build machines; on a machine with a GPU they print why they are skipped.
#include <doctest/doctest.h>

#include "tests/support/fixtures.hpp"
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "ops/backend.hpp"

namespace {

using fusion::test::run_in_source;
using fusion::test::run_result;

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = fusion::test::temp_path("device", name);
  std::ofstream(path) << text;
  return path;
}

const std::string no_device = "cuda:0 requested but no CUDA device is available";

}  // namespace

TEST_CASE("apps/fusion-train: --runtime.device=cuda without a GPU fails fast with a clear error") {
  if (fusion::cuda_device_count() > 0) {
    MESSAGE("skipped: this machine has a CUDA device, so cuda is not an error here");
    return;
  }
  auto ini = write_temp("train.ini", "[model]\nfile=\"configs/models/gpt-char-tiny.pbtxt\"\n[train]\nbatch=8\n"
                                     "steps=2\neval-batches=0\n[output]\nsample-chars=0\n");
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_in_source(std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --config " + ini +
                         " --runtime.device=cuda");
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("runtime.device: " + no_device) != std::string::npos);
  CHECK(r.output.find("step 1") == std::string::npos);  // no training started
  CHECK(took < 30);
  // A device name that is not a device at all is refused the same way.
  auto bad = run_in_source(std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --config " + ini +
                           " --runtime.device=gpu0");
  INFO(bad.output);
  CHECK(bad.status == 2);
  CHECK(bad.output.find("bad device 'gpu0'") != std::string::npos);
  std::filesystem::remove(ini);
}

TEST_CASE("apps/fusion-node: device cuda:0 without a GPU exits 2 with a clear message") {
  if (fusion::cuda_device_count() > 0) {
    MESSAGE("skipped: this machine has a CUDA device, so cuda:0 is not an error here");
    return;
  }
  // Nothing listens on this coordinator address: the node must stop before trying to join.
  auto r = run_in_source(std::string(FUSION_BINARY_DIR) +
                         "/apps/fusion-node --config configs/nodes/site-a.ini --node.name=n0 "
                         "--node.device=cuda:0 --node.coordinator=127.0.0.1:1 --node.join-timeout=30.0");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("node.device: " + no_device) != std::string::npos);
  CHECK(r.output.find("waiting for the coordinator") == std::string::npos);
}
