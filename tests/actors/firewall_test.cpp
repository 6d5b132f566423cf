// Nodes behind a firewall (accept_inbound: false, docs/transport.md "Connection reversal"):
// fusion-node processes on loopback over TLS, where a node that accepts no inbound connection
// listens nowhere and dials the data channels of the nodes that send to it, and the run computes
// the losses of one process. Two such nodes exchanging tensors fall back to CAF through the
// coordinator, saying so.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "actors/trainer.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using fusion::test::src;

using namespace fusion::test::cluster;

namespace {

// wpe fans out to h0.ln1 and h0.res1 on n1; n1 sends forward to n2 and backward to n0, so n1
// receives from both of its neighbours.
const std::string chain3 =
    "placement { policy: \"explicit\" assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" } "
    "assign { node: \"n1\" ops: \"h0.*\" } "
    "assign { node: \"n2\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" } }";

// write_cluster's file with `accept_inbound: false` on the named nodes.
std::string firewalled_cluster(const std::string& name, const std::vector<std::string>& firewalled) {
  std::string text = "name: \"" + name + "\"\ncoordinator { host: \"127.0.0.1\" port: 0 }\n";
  for (int i = 0; i < 3; ++i) text += "site { name: \"s" + std::to_string(i) + "\" }\n";
  for (int i = 0; i < 3; ++i) {
    std::string node = "n";
    node += std::to_string(i);
    bool off = std::find(firewalled.begin(), firewalled.end(), node) != firewalled.end();
    text += "node { name: \"" + node + "\" site: \"s" + std::to_string(i) + "\" device: \"cpu\"" +
            (off ? " accept_inbound: false" : "") + " }\n";
  }
  text += chain3 + "\n";
  auto path = temp_path(name + ".pbtxt");
  std::ofstream(path) << text;
  return path;
}

struct run_output {
  std::vector<double> losses;
  std::vector<std::string> logs;  // per node
};

// Trains 4 steps on n0..n2; the nodes in `listen_nowhere` start with node.accept-inbound=false.
run_output train_on(const std::string& tag, const std::string& cluster, const std::vector<std::string>& listen_nowhere) {
  std::vector<child_process> nodes;
  auto c = tiny_config(4, 2);
  c.cluster_file = cluster;
  c.credentials = fusion::test::coordinator_credentials();
  c.join_timeout_s = 30;
  c.heartbeat_ms = 100;
  c.peer_timeout_ms = 1000;
  c.step_timeout_s = 30;
  c.on_listening = [&](uint16_t port) {
    for (int i = 0; i < 3; ++i) {
      std::string name = "n";
      name += std::to_string(i);
      std::vector<std::string> argv = {std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                                       src("configs/nodes/site-a.ini"), "--node.name=" + name,
                                       "--node.coordinator=127.0.0.1:" + std::to_string(port), "--runtime.threads=1",
                                       "--node.join-timeout=20.0", fusion::test::certs_arg()};
      if (std::find(listen_nowhere.begin(), listen_nowhere.end(), name) != listen_nowhere.end())
        argv.push_back("--node.accept-inbound=false");
      nodes.emplace_back(argv, temp_path(tag + name + ".log"));
    }
  };
  run_output out;
  {
    session s(c);
    out.losses = losses_of(s.train());
  }
  for (auto& n : nodes) {
    CHECK(n.wait(10) == 0);
    out.logs.push_back(n.output());
  }
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void same_losses(const std::vector<double>& got, const std::vector<double>& reference) {
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-6 * std::abs(reference[i]));
}

}  // namespace

TEST_CASE("firewall: a node that accepts no inbound connection dials its senders and the run trains as one process") {
  const auto reference = losses_of(session(tiny_config(4, 2)).train());
  SUBCASE("listening nowhere") {
    auto r = train_on("fw-nowhere-", firewalled_cluster("fw-nowhere", {"n1"}), {"n1"});
    same_losses(r.losses, reference);
    const auto& n1 = r.logs[1];
    INFO(n1);
    CHECK(contains(n1, "accepts no inbound connection: it dials the data channels"));
    CHECK(contains(n1, "opened the data channel connection from node 'n0'"));
    CHECK(contains(n1, "opened the data channel connection from node 'n2'"));
    CHECK(contains(n1, "data channel: accepted 0 connection(s), dialed 2 to nodes that send to this one"));
  }
  SUBCASE("listening, but firewalled in the cluster file: nobody dials it, not even the link probe") {
    auto r = train_on("fw-listening-", firewalled_cluster("fw-listening", {"n1"}), {});
    same_losses(r.losses, reference);
    INFO(r.logs[1]);
    CHECK(contains(r.logs[1], "data channel: accepted 0 connection(s), dialed 2 to nodes that send to this one"));
  }
}

TEST_CASE("firewall: two neighbours that both accept no inbound connection exchange tensors through the coordinator") {
  const auto reference = losses_of(session(tiny_config(4, 2)).train());
  auto r = train_on("fw-both-", firewalled_cluster("fw-both", {"n0", "n1"}), {"n0", "n1"});
  same_losses(r.losses, reference);
  // n0 sends forward to n1 and n1 backward to n0: both say so; n1's forward edge to n2 is a plain
  // connection, and n2's backward edge to n1 is reversed.
  INFO(r.logs[0] << r.logs[1]);
  CHECK(contains(r.logs[0], "neither this node nor node 'n1' accepts inbound connections"));
  CHECK(contains(r.logs[1], "neither this node nor node 'n0' accepts inbound connections"));
  CHECK(contains(r.logs[1], "opened the data channel connection from node 'n2'"));
}
