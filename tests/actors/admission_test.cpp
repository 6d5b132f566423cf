// Admission by certificate against real fusion-node processes (docs/security.md): a node in
// plaintext, one with a certificate of another cluster's CA and one whose valid certificate
// names a node the cluster file lacks are each refused with a clear message, while the run with
// the right node goes on; raw bytes announcing a 4 GiB CAF message reach no parser.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/trainer.hpp"
#include "security/certs.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using namespace fusion::test::cluster;

namespace {

double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

child_process node_with(const std::string& name, uint16_t port, std::vector<std::string> security,
                        const std::string& log) {
  std::vector<std::string> argv = {std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                                   fusion::test::src("configs/nodes/site-a.ini"), "--node.name=" + name,
                                   "--node.coordinator=127.0.0.1:" + std::to_string(port), "--runtime.threads=1",
                                   "--node.join-timeout=20.0"};
  argv.insert(argv.end(), security.begin(), security.end());
  return child_process(argv, temp_path(log + ".log"));
}

// Opens a TCP connection and sends what a CAF 0.17 BASP header announcing a 4 GiB payload looks
// like (the payload length sits in the first bytes), then keeps the connection open.
int send_huge_header(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  unsigned char header[32];
  std::memset(header, 0xff, sizeof header);
  (void)!::send(fd, header, sizeof header, MSG_NOSIGNAL);
  return fd;
}

}  // namespace

TEST_CASE("security: plaintext, foreign-CA and unlisted nodes are refused, the run goes on") {
  auto other_ca = temp_path("other-ca");
  std::filesystem::remove_all(other_ca);
  security::make_cluster_certs(other_ca, {"n0"});
  std::vector<child_process> nodes, intruders;
  std::vector<int> raw_fds;
  auto c = tiny_config(3, 1);
  on_nodes(c, write_cluster("admit", 1, "placement { policy: \"even\" }"), 1, nodes, "admit");
  auto start_good = c.on_listening;
  c.on_listening = [&](uint16_t port) {
    intruders.push_back(node_with("n0", port, {"--security.mode=off"}, "admit-plain"));
    intruders.push_back(node_with("n0", port, {"--security.certs=" + other_ca}, "admit-foreign"));
    intruders.push_back(node_with("stranger", port, {fusion::test::certs_arg()}, "admit-stranger"));
    for (int i = 0; i < 20; ++i) raw_fds.push_back(send_huge_header(port));
    start_good(port);
  };
  double rss_before = rss_mib();
  train_result r;
  {
    session s(c);
    r = s.train();
    // The coordinator keeps listening until the session ends: an intruder slower to start than
    // three tiny steps (a loaded machine) is still answered, not left to its join timeout.
    REQUIRE(intruders.size() == 3);
    for (auto& n : intruders) CHECK(n.wait(30) == 2);
  }
  double rss_after = rss_mib();
  for (int fd : raw_fds)
    if (fd >= 0) ::close(fd);
  CHECK(r.steps_run == 3);
  // A 4 GiB buffer would show; training the tiny model itself takes tens of MiB.
  CHECK(rss_after - rss_before < 512);
  auto plain = intruders[0].output(), foreign = intruders[1].output(), stranger = intruders[2].output();
  INFO("plaintext node: " << plain << "\nforeign-CA node: " << foreign << "\nunlisted node: " << stranger);
  CHECK(plain.find("WARNING: security.mode=off") != std::string::npos);
  CHECK(plain.find("may require TLS") != std::string::npos);
  CHECK(foreign.find("TLS handshake with the coordinator at 127.0.0.1:") != std::string::npos);
  CHECK(stranger.find("refused this node") != std::string::npos);
  CHECK(stranger.find("'stranger' is not in cluster file") != std::string::npos);
  std::filesystem::remove_all(other_ca);
}

TEST_CASE("security: a node's own files under another node's name are refused before it connects") {
  auto certs = fusion::test::certs_dir();
  auto n = node_with("n1", 1,
                     {"--security.ca=" + certs + "/ca.pem", "--security.certificate=" + certs + "/nodes/n0.pem",
                      "--security.key=" + certs + "/nodes/n0.key"},
                     "admit-borrowed");
  CHECK(n.wait(30) == 2);
  INFO(n.output());
  CHECK(n.output().find("belongs to node 'n0', not to node 'n1'") != std::string::npos);
  CHECK(n.output().find("waiting for the coordinator") == std::string::npos);
}
