// The live scheduler on fusion-node processes (actors/scheduler_actor.hpp): a node slowed to a
// fifth of its speed mid-run loses its ops after the confirmations, every verdict is in the
// metrics with its reason, the losses stay those of one process; a node slower than its join-time
// profile loses its work at the first re-plan (scheduler.first), without confirmations; and the
// admin commands plan, rebalance, scheduler and set, with their errors.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
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

TEST_CASE("scheduler: a node slowed to a fifth loses its ops after the confirmations, losses unchanged") {
  const int steps = 40;
  std::vector<child_process> nodes;
  auto c = tiny_config(steps, 2);
  on_nodes(c, write_cluster("sched", 3, ""), 3, nodes, "sched");  // OP-Fence, the default policy
  c.metrics_file = temp_path("sched-metrics.jsonl");
  c.rebalance.every = 2;
  c.rebalance.confirmations = 2;
  c.rebalance.horizon = 100;
  c.rebalance.first = 0;  // the confirmations are what this test watches (the first re-plan: below)
  const graph g = load_graph(c.model_file, c.batch);
  std::string slowed;
  std::map<std::string, double> before;
  double fewest = 0;  // FLOPs on the slowed node, the fewest seen while it was slow
  std::vector<double> got;
  {
    session s(c);
    train_result r;
    std::thread trainer([&] { r = s.train(); });
    for (int i = 0; i < 3000 && step_of(s) < 8; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    before = flops_per_node(s, g);
    for (auto& [node, f] : before)
      if (slowed.empty() || f > before[slowed]) slowed = node;
    fewest = before[slowed];
    {
      duty_cycle slow(nodes[std::stoi(slowed.substr(1))].pid(), 0.2);
      // Until work has left it: once the node is fast again the scheduler may move work back.
      for (int i = 0; i < 12000 && step_of(s) < steps - 4 && fewest >= before[slowed]; ++i) {
        fewest = std::min(fewest, flops_per_node(s, g)[slowed]);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    trainer.join();
    got = losses_of(r);
  }
  INFO("slowed " << slowed << ": " << before[slowed] << " FLOPs a step before, " << fewest << " at the fewest");
  CHECK(fewest < before[slowed]);
  // Every verdict is in the metrics, with its reason; the migration too.
  int verdicts = 0, migrations = 0, step_lines = 0;
  std::string reasons;
  std::map<std::string, double> node_cpu;  // every node's process CPU over the run
  std::ifstream metrics(c.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    auto j = json::parse(line);
    if (j["type"] == "step") {
      ++step_lines;
      REQUIRE(j.contains("node_cpu_s"));
      CHECK(j["node_cpu_s"].size() == 3);
      for (auto& [node, cpu] : j["node_cpu_s"].items()) {
        CHECK(cpu.get<double>() >= 0);
        node_cpu[node] += cpu.get<double>();
      }
    }
    if (j["type"] == "schedule") {
      ++verdicts;
      CHECK(j.contains("predicted_step_s"));
      CHECK_FALSE(j["reason"].get<std::string>().empty());
      reasons += j["verdict"].get<std::string>() + " ";
    }
    if (j["type"] == "migration" && j["ok"] == true) {
      ++migrations;
      CHECK(j["reason"].get<std::string>().rfind("scheduler: moving", 0) == 0);
    }
  }
  CHECK(step_lines == steps);
  REQUIRE(node_cpu.size() == 3);
  for (auto& [node, cpu] : node_cpu) CHECK_MESSAGE(cpu > 0.01, node << " used " << cpu << " s of CPU over the run");
  INFO("verdicts: " << reasons);
  CHECK(verdicts >= 3);
  CHECK(migrations >= 1);
  CHECK(reasons.find("wait migrate") != std::string::npos);  // confirmed, then moved
  // Migrations keep the arithmetic: the losses of one process.
  const auto reference = losses_of(session(tiny_config(steps, 2)).train());
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-6 * std::abs(reference[i]));
}

TEST_CASE("scheduler: the first re-plan at step 6 moves work off a node slower than its profile, no confirmations") {
  // The join-time profile sees three equal nodes; from step 1 on the busiest runs at a tenth of
  // its speed (a node whose machine got busy after the join). Regular evaluations are out of
  // reach (every 1000 steps, 5 confirmations): only the first re-plan, on the measured steps 3
  // to 6, can move the work, and must do so at once.
  const int steps = 30;
  std::vector<child_process> nodes;
  auto c = tiny_config(steps, 2);
  on_nodes(c, write_cluster("sched-first", 3, ""), 3, nodes, "sched-first");
  c.metrics_file = temp_path("sched-first-metrics.jsonl");
  c.rebalance.every = 1000;
  c.rebalance.confirmations = 5;
  c.rebalance.first = 6;
  const graph g = load_graph(c.model_file, c.batch);
  std::string slowed;
  std::map<std::string, double> before, after;
  std::vector<double> got;
  {
    session s(c);  // joined, profiled and placed: the plan is made
    before = flops_per_node(s, g);
    for (auto& [node, f] : before)
      if (slowed.empty() || f > before[slowed]) slowed = node;
    {
      // Slow from the first step on: the measured steps see it. A period well below a step (about
      // 10 ms here): with a 10 ms period at a fifth, the node's work could fall into its run
      // windows step after step, its ops measured near full speed and only the waits between them
      // slow (a first re-plan then saw a 9.4% gain, below the 10% threshold, in a clean-clone run;
      // 32-62% in others). At a tenth in 2.5 ms periods: 26-51% in six runs on a loaded machine.
      duty_cycle slow(nodes[std::stoi(slowed.substr(1))].pid(), 0.1, std::chrono::microseconds(2500));
      train_result r;
      std::thread trainer([&] { r = s.train(); });
      for (int i = 0; i < 12000 && step_of(s) < 10; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      after = flops_per_node(s, g);
      trainer.join();
      got = losses_of(r);
    }
  }
  INFO("slowed " << slowed << ": " << before[slowed] << " FLOPs a step before, " << after[slowed] << " at step 10");
  // Its work, not its op count: a re-plan that measured it slow may still hand it more, cheaper
  // ops (a node's unmeasured ops were once predicted from its last few short ops, which ran
  // between the stops at full speed, and its heavy work was swapped for 12 light ops).
  CHECK(after[slowed] < before[slowed]);
  int firsts = 0, migrations = 0;
  std::ifstream metrics(c.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    auto j = json::parse(line);
    if (j["type"] == "schedule") {
      INFO(line);
      CHECK(j["step"] == 6);  // no other evaluation before step 1000
      CHECK(j["first"] == true);
      CHECK(j["verdict"] == "migrate");
      CHECK(j["confirmed"] == 1);
      ++firsts;
    }
    if (j["type"] == "migration" && j["ok"] == true) {
      ++migrations;
      CHECK(j["reason"].get<std::string>().rfind("scheduler: first re-plan on measured steps: moving", 0) == 0);
    }
  }
  CHECK(firsts == 1);
  CHECK(migrations == 1);
  const auto reference = losses_of(session(tiny_config(steps, 2)).train());
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-6 * std::abs(reference[i]));
}

TEST_CASE("scheduler: plan, rebalance, scheduler and set answer, and refuse what they cannot do") {
  std::vector<child_process> nodes;
  auto c = tiny_config(6, 2);
  on_nodes(c, write_cluster("sched-cmd", 2, ""), 2, nodes, "sched-cmd");
  session s(c);
  auto plan = json::parse(s.command("plan"));
  CHECK(plan.contains("verdict"));
  CHECK(plan.contains("predicted_step_s"));
  CHECK_FALSE(plan["reason"].get<std::string>().empty());
  auto sched = json::parse(s.command("scheduler", {"off"}));
  CHECK(sched["enabled"] == false);
  CHECK(sched["applies"] == true);
  CHECK(json::parse(s.command("set", {"scheduler.every=3"}))["every"] == 3);
  CHECK(command_error(s, "set", {"scheduler.every=0"}).find("scheduler.every must be at least 1, got 0") !=
        std::string::npos);
  CHECK(command_error(s, "set", {"speed"}).find("usage: set KEY=VALUE") != std::string::npos);
  CHECK(command_error(s, "set", {"speed=1"}).find("unknown setting 'speed'") != std::string::npos);
  CHECK(command_error(s, "scheduler", {"maybe"}).find("usage: scheduler [on|off]") != std::string::npos);
  CHECK(command_error(s, "rebalance", {"now"}).find("usage: rebalance [-y]") != std::string::npos);
  CHECK(command_error(s, "compress", {"999", "0.1"}).find("no edge '999' in the current plan") != std::string::npos);
  CHECK(command_error(s, "checkpoint", {}).find("no output.checkpoint file") != std::string::npos);
  CHECK(command_error(s, "checkpoint", {"/proc/no/such/dir/x.ckpt"}).find("cannot write checkpoint") !=
        std::string::npos);
  auto ckpt = temp_path("sched-cmd.ckpt");
  CHECK(json::parse(s.command("checkpoint", {ckpt}))["checkpoint"] == ckpt);
  // A compressible edge gets a codec, then back to dense.
  const auto placement = json::parse(s.query("placement"));
  std::string edge;
  for (auto& e : placement["edges"])
    if (e["dir"] == "fwd" && e["producer"] != "tokens" && e["producer"] != "targets" && edge.empty())
      edge = std::to_string(e["id"].get<uint64_t>());
  if (!edge.empty()) {
    CHECK(json::parse(s.command("compress", {edge, "0.25"}))["codec"].get<std::string>().find("topk 25%") == 0);
    CHECK(json::parse(s.command("compress", {edge, "none"}))["codec"] == "none");
    CHECK(command_error(s, "compress", {edge, "2"}).find("not none, auto or a keep ratio in (0, 1]") !=
          std::string::npos);
    CHECK(command_error(s, "compress", {edge, "auto"}).find("which this run does not use") != std::string::npos);
  }
  CHECK(losses_of(s.train()).size() == 6);
}
