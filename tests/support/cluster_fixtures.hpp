// Fixtures of the tests that train on fusion-node processes: cluster files on loopback, node
// processes started once the coordinator listens, the tiny config they train; all of them with
// mutual TLS (tests/support/certs_fixture.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/trainer.hpp"
#include "tests/support/certs_fixture.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

namespace fusion::test::cluster {

inline std::string temp_path(const std::string& name) { return fusion::test::temp_path("cluster", name); }

// A cluster file of `n` nodes n0..n{n-1}, one site each, coordinator on any free port.
inline std::string write_cluster(const std::string& name, int n, const std::string& placement) {
  std::string text = "name: \"" + name + "\"\ncoordinator { host: \"127.0.0.1\" port: 0 }\n";
  for (int i = 0; i < n; ++i) text += "site { name: \"s" + std::to_string(i) + "\" }\n";
  for (int i = 0; i < n; ++i)
    text += "node { name: \"n" + std::to_string(i) + "\" site: \"s" + std::to_string(i) + "\" device: \"cpu\" }\n";
  text += placement + "\n";
  auto path = temp_path(name + ".pbtxt");
  std::ofstream(path) << text;
  return path;
}

inline child_process start_node(const std::string& name, uint16_t port, const std::string& log_name) {
  return child_process({std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                        src("configs/nodes/site-a.ini"), "--node.name=" + name,
                        "--node.coordinator=127.0.0.1:" + std::to_string(port), "--runtime.threads=1",
                        "--node.join-timeout=20.0", certs_arg()},
                       temp_path(log_name + ".log"));
}

inline train_config tiny_config(int64_t steps, int64_t micro_batches) {
  auto c = tiny_train_config(steps, micro_batches, 7);
  c.threads = 1;
  return c;
}

// Makes `c` run on `n` node processes, which are started once the coordinator listens.
inline void on_nodes(train_config& c, const std::string& cluster, int n, std::vector<child_process>& nodes,
              const std::string& tag) {
  c.cluster_file = cluster;
  c.credentials = coordinator_credentials();
  c.join_timeout_s = 30;
  c.heartbeat_ms = 100;
  c.peer_timeout_ms = 1000;
  c.step_timeout_s = 30;
  c.on_listening = [&nodes, n, tag](uint16_t port) {
    for (int i = 0; i < n; ++i) {
      std::string name = "n";  // (operator+ on a literal trips a GCC 12 -Wrestrict false positive)
      name += std::to_string(i);
      nodes.push_back(start_node(name, port, tag + name));
    }
  };
}

inline std::string all_output(const std::vector<child_process>& nodes) {
  std::string out;
  for (auto& n : nodes) out += n.output();
  return out;
}

// The step the run has reached (the `status` query).
inline int step_of(session& s) { return nlohmann::json::parse(s.query("status"))["step"].get<int>(); }

// Waits (at most 30 s) until the run has reached `step`.
inline void wait_for_step(session& s, int step) {
  for (int i = 0; i < 6000 && step_of(s) < step; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// The message of the error an admin command ends with ("" when it succeeds).
inline std::string command_error(session& s, const std::string& verb, const std::vector<std::string>& args) {
  try {
    s.command(verb, args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace fusion::test::cluster
