// Fixtures of the tests that load or watch node processes while a run trains on them: where
// the ops and their work are (the `placement` query) and a CPU cap on a process without cgroups (no root).
#pragma once

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/trainer.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"

namespace fusion::test::cluster {

// Every graph node of the run as (op, node name), from the `placement` query.
inline std::vector<std::pair<std::string, std::string>> placed_ops(session& s) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto placement = nlohmann::json::parse(s.query("placement"));
  for (auto& o : placement["ops"]) out.emplace_back(o["op"].get<std::string>(), o["node"].get<std::string>());
  return out;
}

// Compute ops (not data inputs) per node name.
inline std::map<std::string, int> ops_per_node(session& s) {
  std::map<std::string, int> out;
  for (auto& [op, node] : placed_ops(s))
    if (op != "tokens" && op != "targets") ++out[node];
  return out;
}

// Estimated FLOPs of a step per node name (op_flops of `g`, the run's model): the work a node
// holds. An op count is not: a re-plan may hand a node more ops of less work.
inline std::map<std::string, double> flops_per_node(session& s, const graph& g) {
  const std::vector<double> flops = op_flops(g);
  std::map<std::string, double> out;
  for (auto& [op, node] : placed_ops(s))
    if (const int id = g.find(op); id >= 0) out[node] += flops[static_cast<size_t>(id)];
  return out;
}

// Holds a process stopped `1 - share` of every period (SIGSTOP / SIGCONT): a CPU cap without
// cgroups, so the test needs no root. A shorter period catches more of the short ops of the tiny
// model mid-way, so fewer steps measure the slowdown.
class duty_cycle {
 public:
  duty_cycle(pid_t pid, double share, std::chrono::microseconds period = std::chrono::milliseconds(50))
      : thread_([this, pid, share, period] {
      const auto run = std::chrono::microseconds(static_cast<int64_t>(static_cast<double>(period.count()) * share));
      while (!stop_) {
        std::this_thread::sleep_for(run);
        ::kill(pid, SIGSTOP);
        std::this_thread::sleep_for(period - run);
        ::kill(pid, SIGCONT);
      }
    }) {}
  ~duty_cycle() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fusion::test::cluster
