// Measured profiles across fusion-node processes on loopback: a run on two sites times every
// distinct op on both nodes, probes the one site pair and writes the profile file; a second run
// (fusion-train --profile FILE) loads it instead of measuring; a malformed file fails the run
// naming the file.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "actors/trainer.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/profile.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::src;

using namespace fusion::test::cluster;

namespace {

// Sends this process's stderr (the coordinator's progress lines) to a file until finish().
class stderr_capture {
 public:
  explicit stderr_capture(std::string path) : path_(std::move(path)) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~stderr_capture() { restore(); }
  std::string finish() {
    restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("profile: a two-site run measures every op and the link and saves the profile, which a second run loads") {
  const std::string cluster = write_cluster("profile2", 2, "placement { policy: \"even\" }");
  const std::string profile = temp_path("profile2.json");
  std::filesystem::remove(profile);

  // ---- first run: measures ----
  std::vector<child_process> nodes;
  auto c = tiny_config(2, 2);  // micro-batch 4
  on_nodes(c, cluster, 2, nodes, "profile2-a");
  c.profile_file = profile;
  c.progress = true;
  std::string out;
  {
    stderr_capture capture(temp_path("profile2-a-coordinator.log"));
    {
      session s(c);
      s.train();
    }
    out = capture.finish();
  }
  INFO(out);
  INFO(all_output(nodes));
  for (auto& n : nodes) CHECK(n.wait(10) == 0);
  CHECK(out.find("fusion-train: measuring 2 node(s)") != std::string::npos);
  CHECK(out.find("profile saved to " + profile) != std::string::npos);
  auto at = out.find("measured the cluster in ");
  REQUIRE(at != std::string::npos);
  const double took = std::stod(out.substr(at + 24));
  MESSAGE("measuring 2 nodes and 1 link on loopback took " << took << " s");
  CHECK(took < 5);
  // The table: one line per node, one per link.
  CHECK(out.find("  n0              s0") != std::string::npos);
  CHECK(out.find("  n1              s1") != std::string::npos);
  CHECK(out.find("  s0 - s1 ") != std::string::npos);
  CHECK(count_of(all_output(nodes), " ops on cpu in ") == 2);

  // The file: every node timed every distinct op of the run, the one site pair probed.
  REQUIRE(std::filesystem::exists(profile));
  cluster_spec spec = load_cluster(cluster);
  cluster_profile p = load_profile(profile, spec);
  graph g = load_graph(c.model_file, c.batch / c.micro_batches);
  CHECK(p.model == g.name);
  CHECK(p.micro_batch == 4);
  REQUIRE(p.nodes.size() == 2);
  for (auto& n : p.nodes) {
    CAPTURE(n.name);
    CHECK(n.cpu_share > 0);
    CHECK(n.cpu_share <= 1.5);
    CHECK(n.memory_bytes > 0);
    CHECK(n.ops.size() == distinct_ops(g).size());
    for (int id : distinct_ops(g)) {
      auto it = n.ops.find(op_key(g, id));
      REQUIRE(it != n.ops.end());
      CHECK(it->second.forward_s > 0);
      CHECK(it->second.backward_s > 0);
    }
  }
  const link_profile* l = p.find_link(0, 1);
  REQUIRE(l != nullptr);
  CHECK(l->measured);
  CHECK(l->mbit > 10);  // loopback: gigabits; anything that slow is a broken probe
  CHECK(l->rtt_s > 0);

  // ---- second run: fusion-train with [cluster] profile loads it and measures nothing ----
  // The run config sits next to the cluster and profile files and names them relative to
  // itself; fusion-train runs in the source tree.
  const auto before = std::filesystem::last_write_time(profile);
  namespace fs = std::filesystem;
  const std::string ini = temp_path("profile2.ini");
  std::ofstream(ini) << "[model]\nfile=\"" << c.model_file << "\"\n[data]\nfile=\"" << c.data_file
                     << "\"\n[train]\nbatch=8\nmicro-batches=2\nsteps=1\neval-every=0\neval-batches=0\n"
                     << "[output]\nsample-chars=0\n[runtime]\nthreads=1\n"
                     << "[cluster]\nfile=\"" << fs::path(cluster).filename().string() << "\"\nprofile=\""
                     << fs::path(profile).filename().string() << "\"\nheartbeat-ms=100\npeer-timeout-ms=1000\n";
  child_process coordinator({std::string(FUSION_BINARY_DIR) + "/apps/fusion-train", "--config", ini,
                             fusion::test::certs_arg()},
                            temp_path("profile2-b-coordinator.log"), FUSION_SOURCE_DIR);
  uint16_t port = 0;
  for (int i = 0; i < 1500 && port == 0; ++i) {
    auto text = coordinator.output();
    auto on = text.find("on 127.0.0.1:");
    if (on != std::string::npos) port = static_cast<uint16_t>(std::stoi(text.substr(on + 13)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(port != 0);
  std::vector<child_process> again;
  again.push_back(start_node("n0", port, "profile2-b-n0"));
  again.push_back(start_node("n1", port, "profile2-b-n1"));
  int status = coordinator.wait(60);
  const std::string second = coordinator.output();
  INFO(second);
  CHECK(status == 0);
  CHECK(second.find("fusion-train: profile from " + profile + " (measured for gpt-char-tiny at micro-batch 4") !=
        std::string::npos);
  CHECK(second.find("measuring") == std::string::npos);
  CHECK(second.find("was measured for model") == std::string::npos);  // same model, same micro-batch
  for (auto& n : again) CHECK(n.wait(15) == 0);
  CHECK(all_output(again).find(" ops on cpu in ") == std::string::npos);
  CHECK(std::filesystem::last_write_time(profile) == before);  // not written again
  std::filesystem::remove(profile);
  std::filesystem::remove(ini);
}

TEST_CASE("profile: a malformed profile file fails the run naming the file") {
  const std::string cluster = write_cluster("profilebad", 2, "placement { policy: \"even\" }");
  const std::string profile = temp_path("profilebad.json");
  std::ofstream(profile) << "{ \"format\": \"fusion-profile\", \"version\": 1, \"nodes\": [ }\n";
  std::vector<child_process> nodes;
  auto c = tiny_config(1, 2);
  on_nodes(c, cluster, 2, nodes, "profilebad");
  c.profile_file = profile;
  std::string error;
  try {
    session s(c);
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.find("cluster.profile: " + profile + ": malformed JSON at line 1, column") != std::string::npos);
  for (auto& n : nodes) CHECK(n.wait(15) >= 0);
  std::filesystem::remove(profile);
}

TEST_CASE("profile: fusion-train documents cluster.profile and its --profile short form") {
  auto help = fusion::test::run_in_source(std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --help");
  CHECK(help.status == 0);
  CHECK(help.output.find("[--profile FILE]") != std::string::npos);
  CHECK(help.output.find("--cluster.profile=<path>") != std::string::npos);
  // The short form is accepted (and, like every option, checked before anything runs).
  auto bad = fusion::test::run_in_source(std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --profile");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("--profile needs a value") != std::string::npos);
}
