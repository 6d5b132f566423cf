// Device choice of op actors, on any machine: device names, the runtime.cpu-ops globs, a run that
// asks for a missing GPU or for bf16 without a GPU failing before it starts, a CPU run that names every op in cpu-ops
// matching the plain CPU run bit for bit, and a node whose device contradicts the cluster file
// being refused at join time.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "actors/op_device.hpp"
#include "actors/trainer.hpp"
#include "tests/support/certs_fixture.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::losses_of;
using fusion::test::src;
using fusion::test::tiny_train_config;

namespace {

train_config tiny_config(int64_t steps) {
  auto c = tiny_train_config(steps, 2, 5);
  c.threads = 1;
  return c;
}

}  // namespace

TEST_CASE("actors/device: device names, cpu-ops patterns and the op's device") {
  CHECK(cuda_index_of("cpu") == -1);
  CHECK(cuda_index_of("cuda") == 0);
  CHECK(cuda_index_of("cuda:3") == 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "CPU", ""})
    CHECK_THROWS_WITH_AS(cuda_index_of(bad), doctest::Contains("bad device"), std::runtime_error);
  CHECK(normalize_device("cuda") == "cuda:0");
  CHECK(device_usable("cpu").ok());
  CHECK(device_usable("tpu").error().find("bad device 'tpu'") != std::string::npos);
  if (cuda_device_count() == 0)
    CHECK(device_usable("cuda").error().find("cuda:0 requested but no CUDA device is available") != std::string::npos);
  CHECK(device_usable("cuda:1000").error().find("cuda:1000 requested but") != std::string::npos);

  CHECK(split_patterns("") == std::vector<std::string>{});
  CHECK(split_patterns(" lm_head , h1.*,,loss ") == std::vector<std::string>{"lm_head", "h1.*", "loss"});
  const auto pats = split_patterns("lm_head,h1.*");
  CHECK(device_for_op("cuda:0", pats, "lm_head") == "cpu");
  CHECK(device_for_op("cuda:0", pats, "h1.attn") == "cpu");
  CHECK(device_for_op("cuda:0", pats, "h0.attn") == "cuda:0");
  CHECK(device_for_op("cpu", pats, "h0.attn") == "cpu");
}

TEST_CASE("actors/device: runtime.precision names fp32 or bf16, and bf16 needs ops on a GPU") {
  CHECK(parse_gemm_precision("fp32") == gemm_precision::fp32);
  CHECK(parse_gemm_precision("bf16") == gemm_precision::bf16);
  CHECK(std::string(to_string(gemm_precision::bf16)) == "bf16");
  auto c = tiny_config(1);
  c.precision = "fp16";
  CHECK_THROWS_WITH_AS(session{c}, doctest::Contains("runtime.precision: precision 'fp16' is not one of fp32, bf16"),
                       std::runtime_error);
  c.precision = "bf16";
  CHECK_THROWS_WITH_AS(session{c}, doctest::Contains("runtime.precision: bf16 applies to the GEMMs of ops on a GPU"),
                       std::runtime_error);
}

TEST_CASE("actors/device: a session that asks for a missing GPU fails before it starts") {
  if (cuda_device_count() > 0) {
    MESSAGE("skipped: this machine has a CUDA device");
    return;
  }
  auto c = tiny_config(1);
  c.device = "cuda";
  CHECK_THROWS_WITH_AS(session{c}, doctest::Contains("runtime.device: cuda:0 requested but no CUDA device"),
                       std::runtime_error);
  c.cluster_file = src("configs/clusters/local-2.pbtxt");
  c.device = "cuda:0";
  CHECK_THROWS_WITH_AS(session{c}, doctest::Contains("applies to a one-process run"), std::runtime_error);
}

TEST_CASE("actors/device: cpu-ops on a CPU run changes nothing") {
  auto c = tiny_config(3);
  auto plain = losses_of(session(c).train());
  c.cpu_ops = std::string(1, '*');  // (a plain "*" literal trips a GCC 12 -Wrestrict false positive)
  auto same = losses_of(session(c).train());
  REQUIRE(plain.size() == same.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == same[i]);  // exact
}

TEST_CASE("actors/device: a node whose device contradicts the cluster file is refused") {
  auto cluster = (std::filesystem::temp_directory_path() / ("fusion_device_" + std::to_string(::getpid()) +
                                                              "_wrong.pbtxt")).string();
  std::ofstream(cluster) << "name: \"wrong\"\ncoordinator { host: \"127.0.0.1\" port: 0 }\n"
                            "site { name: \"s0\" }\nnode { name: \"n0\" site: \"s0\" device: \"cuda:0\" }\n";
  std::vector<fusion::test::child_process> nodes;
  auto c = tiny_config(1);
  c.cluster_file = cluster;
  c.credentials = fusion::test::coordinator_credentials();
  c.join_timeout_s = 10;  // the refused node never joins: the session waits this long
  c.on_listening = [&nodes, cluster](uint16_t port) {
    nodes.emplace_back(std::vector<std::string>{std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                                                src("configs/nodes/site-a.ini"), "--node.name=n0",
                                                "--node.coordinator=127.0.0.1:" + std::to_string(port),
                                                "--runtime.threads=1", "--node.join-timeout=20.0",
                                                fusion::test::certs_arg()},
                       cluster + ".log");
  };
  CHECK_THROWS_WITH_AS(session{c}, doctest::Contains("did not join"), std::runtime_error);
  REQUIRE(nodes.size() == 1);
  CHECK(nodes[0].wait(20) == 2);
  INFO(nodes[0].output());
  CHECK(nodes[0].output().find("drives cpu but") != std::string::npos);
  CHECK(nodes[0].output().find("gives it device cuda:0") != std::string::npos);
  std::filesystem::remove(cluster);
  std::filesystem::remove(cluster + ".log");
}
