// Membership of a running job (actors/coordinator_join.cpp), against real fusion-node processes:
// a spare node started after training began is profiled, admitted at a step boundary and given
// work by the scheduler, the losses staying those of one process; `drain NODE` empties a node,
// which then leaves while the run goes on (and its errors: an unknown node, a node that left,
// the last node); a node killed, recovered from and started again rejoins the run.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "actors/trainer.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/node_load.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using namespace fusion::test::cluster;
using fusion::test::child_process;
using fusion::test::losses_of;
using json = nlohmann::json;

namespace {

std::string state_of(session& s, const std::string& node) {
  const auto nodes = json::parse(s.query("nodes"));
  for (auto& n : nodes["nodes"])
    if (n["name"] == node) return n["state"].get<std::string>();
  return "?";
}

std::vector<json> records(const std::string& metrics, const std::string& type) {
  std::vector<json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

void check_losses_of_one_process(const train_result& r, int64_t steps, int64_t micro_batches) {
  const auto reference = losses_of(session(tiny_config(steps, micro_batches)).train());
  const auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(std::isfinite(got[i]));
    CHECK(std::abs(got[i] - reference[i]) <= 1e-5 * std::abs(reference[i]));
  }
}

}  // namespace

TEST_CASE("join: a spare started at step 4 of a running job is profiled, admitted at a step boundary and receives work") {
  const std::string tag = "join-spare";
  const int64_t steps = 40;
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  // n0 alone at start (OP-Fence, the default policy); n1 is a spare, started mid-run.
  on_nodes(c, write_cluster(tag, 2, "spare: \"n1\""), 1, nodes, tag);
  uint16_t port = 0;
  auto start_first = c.on_listening;
  c.on_listening = [&](uint16_t p) {
    port = p;
    start_first(p);
  };
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  // The join is judged at once (over the remaining steps); should noise make that verdict
  // "keep", the periodic evaluations (confirmed twice) still can move work onto the node.
  c.rebalance.first = 0;
  c.rebalance.every = 4;
  c.rebalance.confirmations = 2;
  train_result r;
  std::map<std::string, int> at_end;
  std::string n1_state;
  {
    session s(c);
    REQUIRE(nodes.size() == 1);
    // n0 runs at a quarter of a core, so a node that joins at full speed is worth moving work to.
    duty_cycle slow(nodes[0].pid(), 0.25);
    std::thread trainer([&] { r = s.train(); });
    CHECK(state_of(s, "n1") == "spare");
    wait_for_step(s, 4);
    nodes.push_back(start_node("n1", port, tag + "n1"));
    // Admitted at a step boundary while training runs; on a machine so loaded that the node is
    // not in by step 30, the run is held until it is, so that the scheduler has steps left.
    for (int i = 0; i < 12000 && step_of(s) < 30 && state_of(s, "n1") != "joined"; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (state_of(s, "n1") != "joined") {
      s.command("pause", {});
      for (int i = 0; i < 6000 && state_of(s, "n1") != "joined"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s.command("resume", {});
    }
    for (int i = 0; i < 12000 && step_of(s) < steps - 1 && ops_per_node(s)["n1"] == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    trainer.join();
    at_end = ops_per_node(s);
    n1_state = state_of(s, "n1");
  }
  INFO(all_output(nodes));
  for (auto& n : nodes) CHECK(n.wait(15) == 0);
  CHECK(n1_state == "joined");
  CHECK(at_end["n1"] > 0);
  auto joins = records(c.metrics_file, "join");
  REQUIRE(joins.size() == 1);
  INFO(joins[0].dump());
  CHECK(joins[0]["node"] == "n1");
  CHECK(joins[0]["rejoin"] == false);
  CHECK(joins[0]["was"] == "spare");
  CHECK(joins[0]["offered"] == true);
  CHECK(joins[0]["step"].get<int64_t>() >= 4);
  CHECK(joins[0]["links"].size() == 1);  // its site probed against n0's
  CHECK(joins[0]["pause_s"].get<double>() < 1.0);
  bool moved = false;
  for (auto& m : records(c.metrics_file, "migration")) moved = moved || (m["ok"] == true && m["moves"].get<std::string>().find("-> n1") != std::string::npos);
  CHECK(moved);
  REQUIRE(r.steps.size() == static_cast<size_t>(steps));
  check_losses_of_one_process(r, steps, 2);
}

TEST_CASE("join: drain NODE moves its ops to the others, the node leaves, the run goes on, and drain's errors") {
  const std::string tag = "join-drain";
  const int64_t steps = 20;
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  train_result r;
  std::string drained, unknown, again, last, state_n1;
  std::map<std::string, int> after;
  {
    session s(c);
    std::thread trainer([&] { r = s.train(); });
    wait_for_step(s, 3);
    unknown = command_error(s, "drain", {"n9"});
    CHECK(ops_per_node(s)["n1"] > 0);
    drained = s.command("drain", {"n1"});
    after = ops_per_node(s);
    state_n1 = state_of(s, "n1");
    again = command_error(s, "drain", {"n1"});
    s.command("drain", {"n0"});
    last = command_error(s, "drain", {"n2"});
    trainer.join();
  }
  INFO(all_output(nodes));
  INFO(drained);
  CHECK(unknown.find("unknown node 'n9'") != std::string::npos);
  CHECK(unknown.find("nodes: n0, n1, n2") != std::string::npos);
  auto answer = json::parse(drained);
  CHECK(answer["node"] == "n1");
  CHECK(answer["state"] == "left");
  CHECK(after.count("n1") == 0);
  CHECK(after["n0"] + after["n2"] > 0);
  CHECK(state_n1 == "left");
  CHECK(again.find("node 'n1' is left: only a joined node can be drained") != std::string::npos);
  CHECK(last.find("node 'n2' is the last node of the run") != std::string::npos);
  // The drained nodes were told to leave and did so cleanly, while the run went on.
  CHECK(nodes[1].wait(15) == 0);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[2].wait(15) == 0);
  auto leaves = records(c.metrics_file, "leave");
  REQUIRE(leaves.size() == 2);
  CHECK(leaves[0]["node"] == "n1");
  CHECK(leaves[0]["migration"]["ok"] == true);
  REQUIRE(r.steps.size() == static_cast<size_t>(steps));
  check_losses_of_one_process(r, steps, 2);
}

TEST_CASE("join: a node killed, recovered from, then started again rejoins the run") {
  const std::string tag = "join-rejoin";
  const int64_t steps = 24;
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  uint16_t port = 0;
  auto start_all = c.on_listening;
  c.on_listening = [&](uint16_t p) {
    port = p;
    start_all(p);
  };
  c.checkpoint_file = temp_path(tag + "-ckpt");
  c.checkpoint_every = 2;
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove_all(c.checkpoint_file);
  std::filesystem::remove(c.metrics_file);
  train_result r;
  std::string lost_state, back_state;
  {
    session s(c);
    std::thread trainer([&] { r = s.train(); });
    wait_for_step(s, 4);
    nodes[1].signal(SIGKILL);
    nodes[1].wait(10);
    for (int i = 0; i < 4000 && records(c.metrics_file, "recovery").empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lost_state = state_of(s, "n1");
    // Held so that the short run cannot end before the node is profiled: a paused run admits it
    // at once (no step boundary to wait for).
    s.command("pause", {});
    nodes.push_back(start_node("n1", port, tag + "n1-again"));
    for (int i = 0; i < 6000 && state_of(s, "n1") != "joined"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    back_state = state_of(s, "n1");
    s.command("resume", {});
    trainer.join();
  }
  INFO(all_output(nodes));
  CHECK(lost_state == "recovered");
  CHECK(back_state == "joined");
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[2].wait(15) == 0);
  CHECK(nodes.at(3).wait(15) == 0);
  REQUIRE(records(c.metrics_file, "recovery").size() == 1);
  auto joins = records(c.metrics_file, "join");
  REQUIRE(joins.size() == 1);
  INFO(joins[0].dump());
  CHECK(joins[0]["node"] == "n1");
  CHECK(joins[0]["rejoin"] == true);
  CHECK(joins[0]["was"] == "recovered");
  // The policy is even: the scheduler does not move work by itself, and the join says so.
  CHECK(joins[0]["offered"] == false);
  REQUIRE(r.steps.size() == static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) CHECK(r.steps[i].step == i + 1);
  for (auto& st : r.steps) CHECK(std::isfinite(st.loss));
}
