// Helpers of the tests that recover from lost fusion-node processes (tests/actors/recovery*_test.cpp):
// the recovery records of a metrics file, a node killer driven by the step records, checkpoint
// comparison, and the layout of a stage with a replica.
#pragma once

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "tests/support/child_process.hpp"

namespace fusion::test::recovery {

using clock_type = std::chrono::steady_clock;

/// Stage 1 (wte, wpe, h0) on n0, stage 2 (h1, lnf, lm_head, loss) on n1 with a replica on n2.
inline std::string replica_placement() {
  return "placement { policy: \"explicit\" assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" ops: \"h0.*\" } "
         "assign { node: \"n1\" replica: \"n2\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" } }";
}

// The recovery records of a metrics file.
inline std::vector<nlohmann::json> recovery_records(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "recovery") out.push_back(j);
  }
  return out;
}

// Signals node `victim` (SIGKILL: gone at once; SIGSTOP: hung, declared lost after the peer
// timeout) from the coordinator's on_step once step `at` has ended, and notes when the first
// step after that ends.
struct killer {
  killer(std::vector<child_process>* n, size_t v, int64_t a, int s = SIGKILL) : nodes(n), victim(v), at(a), sig(s) {}
  std::vector<child_process>* nodes;
  size_t victim;
  int64_t at;
  int sig;
  bool killed = false;
  clock_type::time_point kill_time, next_step_time;

  void on_step(const step_record& rec) {
    if (!killed && rec.step == at) {
      (*nodes)[victim].signal(sig);
      killed = true;
      kill_time = clock_type::now();
    } else if (killed && next_step_time == clock_type::time_point{}) {
      next_step_time = clock_type::now();
    }
  }
  double seconds_to_next_step() const { return std::chrono::duration<double>(next_step_time - kill_time).count(); }
};

// The largest difference between the f32 tensors of two checkpoints of the same model.
inline double max_weight_difference(const checkpoint& mine, const checkpoint& theirs) {
  REQUIRE(mine.tensors.size() == theirs.tensors.size());
  double worst = 0;
  for (size_t i = 0; i < mine.tensors.size(); ++i) {
    const auto& [name, a] = mine.tensors[i];
    const auto& b = theirs.tensors[i].second;
    CAPTURE(name);
    REQUIRE(theirs.tensors[i].first == name);
    REQUIRE(a.numel() == b.numel());
    if (a.type() != dtype::f32) continue;
    for (int64_t j = 0; j < a.numel(); ++j) worst = std::max(worst, std::abs(double(a.f32()[j]) - double(b.f32()[j])));
  }
  return worst;
}

// The one recovery record of `metrics`: node `lost`, its state taken from the surviving replicas.
inline nlohmann::json replica_recovery(const std::string& metrics, const std::string& lost) {
  auto recs = recovery_records(metrics);
  REQUIRE(recs.size() == 1);
  INFO(recs[0].dump());
  CHECK(recs[0]["nodes"] == nlohmann::json::array({lost}));
  CHECK(recs[0]["state_from"] == "replicas");
  return recs[0];
}

inline void check_consecutive_steps(const train_result& r, int64_t steps) {
  REQUIRE(r.steps.size() == static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) CHECK(r.steps[i].step == i + 1);
}

}  // namespace fusion::test::recovery
