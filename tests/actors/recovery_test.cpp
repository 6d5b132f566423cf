// Automatic recovery from a lost node (docs/recovery.md), against real fusion-node processes: a
// node SIGKILLed mid-step is recovered from the last checkpoint on the survivors, ending with the
// weights of a run resumed by hand from that checkpoint on the same survivor plan; a lost
// replica's node costs no checkpoint and at most the step in flight, the losses staying those of
// an undisturbed run; a loss with nothing to recover from fails naming why, writing nothing.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "core/checkpoint_dir.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using namespace fusion::test::cluster;

namespace {

using clock_type = std::chrono::steady_clock;

// The recovery records of a metrics file.
std::vector<nlohmann::json> recovery_records(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "recovery") out.push_back(j);
  }
  return out;
}

// Kills node `victim` from the coordinator's on_step once step `at` has ended, and notes when the
// first step after that ends.
struct killer {
  std::vector<child_process>* nodes = nullptr;
  size_t victim = 0;
  int64_t at = 0;
  bool killed = false;
  clock_type::time_point kill_time, next_step_time;

  void on_step(const step_record& rec) {
    if (!killed && rec.step == at) {
      (*nodes)[victim].signal(SIGKILL);
      killed = true;
      kill_time = clock_type::now();
    } else if (killed && next_step_time == clock_type::time_point{}) {
      next_step_time = clock_type::now();
    }
  }
  double seconds_to_next_step() const { return std::chrono::duration<double>(next_step_time - kill_time).count(); }
};

void check_consecutive_steps(const train_result& r, int64_t steps) {
  REQUIRE(r.steps.size() == static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) CHECK(r.steps[i].step == i + 1);
}

}  // namespace

TEST_CASE("recovery: a node killed mid-step goes on from the last checkpoint and ends with the weights of a run resumed by hand") {
  const std::string tag = "rec-ckpt";
  const int64_t steps = 12;
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  c.checkpoint_file = temp_path(tag + "-ckpt");
  c.checkpoint_every = 2;
  c.keep_checkpoints = 0;  // the checkpoint the recovery used stays for the run resumed by hand
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove_all(c.checkpoint_file);
  std::filesystem::remove(c.metrics_file);
  killer k{&nodes, 1, 5};
  c.on_step = [&](const step_record& rec, double) { k.on_step(rec); };
  train_result r;
  {
    session s(c);
    r = s.train();
  }
  INFO(all_output(nodes));
  REQUIRE(k.killed);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[2].wait(15) == 0);
  // Every step once (the rewound ones replaced), the run went on within 20 s of the loss.
  check_consecutive_steps(r, steps);
  CHECK(k.seconds_to_next_step() < 20);
  auto recs = recovery_records(c.metrics_file);
  REQUIRE(recs.size() == 1);
  const auto& rec = recs[0];
  INFO(rec.dump());
  CHECK(rec["nodes"] == nlohmann::json::array({"n1"}));
  CHECK(rec["state_from"] == "checkpoint");
  // n1 dies as step 6 begins, so the checkpoint of step 4 is the last unless the machine was
  // slow to notice (then that of step 6); the steps since it and the one in flight run again.
  const int64_t from = rec["step"].get<int64_t>(), detected = rec["detected_step"].get<int64_t>();
  CHECK(from % 2 == 0);
  CHECK(from >= 4);
  CHECK(rec["checkpoint"].get<std::string>().find(checkpoint_file_name(from)) != std::string::npos);
  const int64_t lost = rec["steps_lost"].get<int64_t>();
  CHECK((lost == detected - from || lost == detected + 1 - from));
  CHECK(rec["seconds_to_resume"].get<double>() < 20);

  // By hand: the same checkpoint on the survivors' plan (even over two nodes), to the same step.
  auto h = tiny_config(steps, 2);
  h.resume_from = rec["checkpoint"].get<std::string>();
  h.checkpoint_file = temp_path(tag + "-hand.ckpt");
  std::filesystem::remove(h.checkpoint_file);
  std::vector<child_process> hand_nodes;
  on_nodes(h, write_cluster(tag + "-hand", 2, "placement { policy: \"even\" }"), 2, hand_nodes, tag + "-hand");
  train_result by_hand;
  {
    session s(h);
    CHECK(s.step() == from);
    by_hand = s.train();
  }
  for (auto& n : hand_nodes) CHECK(n.wait(15) == 0);
  REQUIRE(by_hand.steps.size() == static_cast<size_t>(steps - from));
  for (auto& step : by_hand.steps) CHECK(std::abs(step.loss - r.steps[step.step - 1].loss) <= 1e-6 * std::abs(step.loss));
  const checkpoint mine = load_checkpoint(latest_checkpoint(c.checkpoint_file));
  const checkpoint theirs = load_checkpoint(h.checkpoint_file);
  CHECK(mine.step == static_cast<uint64_t>(steps));
  CHECK(theirs.step == static_cast<uint64_t>(steps));
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
  CHECK(worst <= 1e-6);
}

TEST_CASE("recovery: a replica's node lost costs no checkpoint and at most the step in flight, the losses unchanged") {
  const std::string tag = "rec-replica";
  const int64_t steps = 10;
  auto c = tiny_config(steps, 4);
  std::vector<child_process> nodes;
  // Two stages: the first on n0, the second on n1 with a replica on n2.
  on_nodes(c,
           write_cluster(tag, 3,
                         "placement { policy: \"explicit\" assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" ops: \"h0.*\" } "
                         "assign { node: \"n1\" replica: \"n2\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" } }"),
           3, nodes, tag);
  c.recovery_mode = "auto";  // no checkpoint is kept: the replica is the only source
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  killer k{&nodes, 2, 4};
  c.on_step = [&](const step_record& rec, double) { k.on_step(rec); };
  train_result r;
  {
    session s(c);
    r = s.train();
  }
  INFO(all_output(nodes));
  REQUIRE(k.killed);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[1].wait(15) == 0);
  check_consecutive_steps(r, steps);
  auto recs = recovery_records(c.metrics_file);
  REQUIRE(recs.size() == 1);
  INFO(recs[0].dump());
  CHECK(recs[0]["nodes"] == nlohmann::json::array({"n2"}));
  CHECK(recs[0]["state_from"] == "replicas");
  CHECK(recs[0]["checkpoint"] == "");
  CHECK(recs[0]["steps_lost"].get<int64_t>() <= 1);
  CHECK(recs[0]["note"].get<std::string>().find("replica on lost node 'n2' dropped") != std::string::npos);
  // The survivors held the state of the last step: every loss is an undisturbed run's (one
  // process, the same batches), as a run resumed by hand from that state would compute them.
  const auto reference = losses_of(session(tiny_config(steps, 4)).train());
  const auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-5 * std::abs(reference[i]));
}

TEST_CASE("recovery: a node lost with no replica and no checkpoint yet fails saying so, writing nothing") {
  const std::string tag = "rec-none";
  auto c = tiny_config(100000, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  c.checkpoint_file = temp_path(tag + ".ckpt");  // recovery on by default; written only at the end
  c.checkpoint_every = 0;
  std::filesystem::remove(c.checkpoint_file);
  killer k{&nodes, 1, 3};
  c.on_step = [&](const step_record& rec, double) { k.on_step(rec); };
  std::string error;
  try {
    session s(c);
    s.train();
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  REQUIRE(k.killed);
  CHECK(error.find("node 'n1' (site s1) was lost at step ") != std::string::npos);
  CHECK(error.find("the run cannot go on: ops ") != std::string::npos);
  CHECK(error.find("ran only there (no surviving replica) and no checkpoint was written yet") != std::string::npos);
  CHECK(error.find("nothing was written or overwritten") != std::string::npos);
  CHECK(!std::filesystem::exists(c.checkpoint_file));
  CHECK(nodes[0].wait(15) >= 0);
  CHECK(nodes[2].wait(15) >= 0);
}
