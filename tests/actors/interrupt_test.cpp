// Ctrl-C (SIGINT) as a user presses it on fusion-train: while the coordinator waits for nodes,
// while a step is stuck on a hung node, and mid-run with a checkpoint configured. Each exits
// 130 promptly; a checkpoint is written when one can be.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <thread>

#include "core/checkpoint.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"

using namespace fusion;
using namespace fusion::test::cluster;
using fusion::test::child_process;
using fusion::test::src;
using clock_type = std::chrono::steady_clock;

namespace {

child_process start_train(const std::vector<std::string>& extra, const std::string& log) {
  std::vector<std::string> argv = {std::string(FUSION_BINARY_DIR) + "/apps/fusion-train", "--config",
                                   src("configs/runs/char-tiny.ini"), "--train.eval-every=0",
                                   "--train.eval-batches=0", "--output.sample-chars=0", "--output.metrics=\"\""};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(fusion::test::certs_arg());
  return child_process(argv, temp_path(log), FUSION_SOURCE_DIR);
}

bool wait_for_text(const child_process& p, const std::string& text, double seconds) {
  auto end = clock_type::now() + std::chrono::duration<double>(seconds);
  while (clock_type::now() < end) {
    if (p.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

uint16_t port_in(const std::string& out) {
  auto at = out.find("on 127.0.0.1:");
  return at == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(out.substr(at + 13)));
}

}  // namespace

TEST_CASE("interrupt: one Ctrl-C while the coordinator waits for nodes exits 130 at once") {
  auto cluster = write_cluster("int-join", 2, "placement { policy: \"even\" }");
  auto train = start_train({"--cluster", cluster, "--output.checkpoint=\"\""}, "int-join.log");
  REQUIRE(wait_for_text(train, "waiting for 2 node(s)", 20));
  auto t0 = clock_type::now();
  train.signal(SIGINT);
  int status = train.wait(5);
  INFO(train.output());
  CHECK(status == 130);
  CHECK(seconds_since(t0) < 3.0);
  CHECK(train.output().find("interrupted") != std::string::npos);
}

TEST_CASE("interrupt: Ctrl-C mid-run finishes the step, writes the checkpoint and exits 130") {
  auto ckpt = temp_path("int-run.ckpt");
  std::filesystem::remove(ckpt);
  auto train = start_train({"--steps", "100000", "--output.checkpoint=\"" + ckpt + "\"", "--train.log-every=1"},
                           "int-run.log");
  REQUIRE(wait_for_text(train, "step 3/", 60));
  auto t0 = clock_type::now();
  train.signal(SIGINT);
  int status = train.wait(10);
  INFO(train.output());
  CHECK(status == 130);
  CHECK(seconds_since(t0) < 5.0);
  REQUIRE(std::filesystem::exists(ckpt));
  CHECK(load_checkpoint(ckpt).step >= 3);
  std::filesystem::remove(ckpt);
}

TEST_CASE("interrupt: Ctrl-C while a step is stuck on a hung node exits 130 within the stop grace") {
  auto cluster = write_cluster("int-stuck", 2, "placement { policy: \"even\" }");
  // A long peer timeout: the hung node is not declared dead, the step just hangs.
  auto train = start_train({"--cluster", cluster, "--steps", "100000", "--output.checkpoint=\"\"",
                            "--cluster.heartbeat-ms=1000", "--cluster.peer-timeout-ms=600000",
                            "--runtime.stop-grace=2.0", "--train.log-every=1"},
                           "int-stuck.log");
  REQUIRE(wait_for_text(train, "waiting for 2 node(s)", 20));
  uint16_t port = port_in(train.output());
  REQUIRE(port != 0);
  std::vector<child_process> nodes;
  nodes.push_back(start_node("n0", port, "int-stuck-n0"));
  nodes.push_back(start_node("n1", port, "int-stuck-n1"));
  REQUIRE(wait_for_text(train, "step 2/", 60));
  nodes[1].signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto t0 = clock_type::now();
  train.signal(SIGINT);
  int status = train.wait(10);
  INFO(train.output());
  CHECK(status == 130);
  CHECK(seconds_since(t0) < 2.0 + 3.0);
  CHECK(train.output().find("did not finish within 2 s") != std::string::npos);
  nodes[1].signal(SIGCONT);
  nodes[1].signal(SIGKILL);
  nodes[0].signal(SIGKILL);
}
