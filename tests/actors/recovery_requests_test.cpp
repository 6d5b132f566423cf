// Requests and commands that arrive while a recovery from a lost node runs (docs/recovery.md,
// "What happens"), against real fusion-node processes. A survivor stopped (SIGSTOP) for a
// moment holds the recovery open, so that they arrive during it: between train calls, a save
// and an admin checkpoint wait for it, and one the loss cut short is answered and asked again; during training, a move
// queued meanwhile runs at the next step boundary beside the new snapshot holders.
#include <doctest/doctest.h>

#include <signal.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/recovery_fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using namespace fusion::test::cluster;
using namespace fusion::test::recovery;

namespace {

// Waits (at most 5 s) until the `nodes` query shows a lost node.
bool wait_for_loss(session& s) {
  for (int i = 0; i < 500; ++i) {
    if (s.query("nodes").find("\"lost\"") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Continues node `n` (stopped) after 1.5 s, on a thread of its own.
std::thread continue_later(child_process& n) {
  return std::thread([&n] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ::kill(n.pid(), SIGCONT);
  });
}

// The tiny run on n0-n2 (replica_placement(): n2's loss is recovered from n1, which holds the
// replica of its stage) with recovery on and a metrics file. Its peer timeout lets n0 be
// stopped a while without being lost.
train_config held_recovery_config(const std::string& tag, int64_t steps, std::vector<child_process>& nodes) {
  auto c = tiny_config(steps, 4);
  on_nodes(c, write_cluster(tag, 3, replica_placement()), 3, nodes, tag);
  c.peer_timeout_ms = 8000;
  c.recovery_mode = "auto";
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  return c;
}

}  // namespace

TEST_CASE("recovery: a save and admin checkpoints asked for while a recovery runs between train calls, or cut short by it, wait for it and save the recovered state") {
  const std::string tag = "rec-ready";
  const int64_t steps = 3;
  std::vector<child_process> nodes;
  auto c = held_recovery_config(tag, steps, nodes);
  c.eval_batches = 2;
  const std::string saved = temp_path(tag + "-saved.ckpt"), by_admin = temp_path(tag + "-admin.ckpt"),
                    cut_short = temp_path(tag + "-cut-short.ckpt");
  for (const auto& path : {saved, by_admin, cut_short}) std::filesystem::remove(path);
  {
    session s(c);
    s.train();
    // n0 stopped holds the recovery from n2's loss open: it cannot spawn or restore there.
    REQUIRE(::kill(nodes[0].pid(), SIGSTOP) == 0);
    // Started before the loss, it waits for n0's actors; the loss cuts it short. Its replies
    // are dropped then, and once nothing answered it at all.
    auto first = std::async(std::launch::async, [&] { return s.command("checkpoint", {cut_short}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    REQUIRE(::kill(nodes[2].pid(), SIGKILL) == 0);
    REQUIRE(wait_for_loss(s));
    // Queued while the recovery runs; once, nothing answered it before the next train call.
    auto admin = std::async(std::launch::async, [&] { return s.command("checkpoint", {by_admin}); });
    std::thread wake = continue_later(nodes[0]);
    // Once served at once: it asked the lost node's actors for their state and the run failed.
    std::string failure;
    try {
      s.save_checkpoint(saved);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    wake.join();
    CHECK_MESSAGE(failure.empty(), failure);
    for (auto* f : {&first, &admin}) REQUIRE(f->wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    CHECK(first.get().find(cut_short) != std::string::npos);  // asked again by the session
    CHECK(admin.get().find(by_admin) != std::string::npos);
    CHECK(s.step() == steps);
    CHECK(std::isfinite(s.evaluate().loss));
  }
  INFO(all_output(nodes));
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[1].wait(15) == 0);
  replica_recovery(c.metrics_file, "n2");
  // Every file holds the recovered state of step 3, which is the undisturbed run's: n1 kept it.
  auto ref = tiny_config(steps, 4);
  ref.checkpoint_file = temp_path(tag + "-ref.ckpt");
  std::filesystem::remove(ref.checkpoint_file);
  session(ref).train();
  const checkpoint want = load_checkpoint(ref.checkpoint_file);
  for (const auto& path : {saved, by_admin, cut_short}) {
    CAPTURE(path);
    const checkpoint got = load_checkpoint(path);
    CHECK(got.step == static_cast<uint64_t>(steps));
    CHECK(max_weight_difference(got, want) <= 1e-5);
  }
}

TEST_CASE("recovery: a move queued while a recovery with peer snapshots runs is made at the next step boundary, the losses unchanged") {
  // The recovery's end makes the survivors' snapshot holders and, in the same handler, starts
  // the queued move. The holders' edges once took their ids when the holders answered, from
  // the counter the move's plan had already numbered its edges from: two edges with one id.
  const std::string tag = "rec-move-queued";
  const int64_t steps = 8;
  std::vector<child_process> nodes;
  auto c = held_recovery_config(tag, steps, nodes);
  c.snapshot_every = 1;
  std::atomic<bool> killed{false};
  c.on_step = [&](const step_record& rec, double) {
    if (rec.step != 3 || killed) return;
    ::kill(nodes[0].pid(), SIGSTOP);
    ::kill(nodes[2].pid(), SIGKILL);
    killed = true;
  };
  train_result r;
  std::string moved;
  {
    session s(c);
    auto training = std::async(std::launch::async, [&] { return s.train(); });
    for (int i = 0; i < 3000 && !killed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(killed);
    REQUIRE(wait_for_loss(s));
    auto move = std::async(std::launch::async, [&] { return s.command("move", {"wpe", "n1"}); });
    std::thread wake = continue_later(nodes[0]);
    wake.join();
    try {
      moved = move.get();
    } catch (const std::exception& e) {
      moved = std::string("failed: ") + e.what();
    }
    r = training.get();
  }
  INFO(all_output(nodes));
  INFO(moved);
  CHECK(moved.find("failed") == std::string::npos);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[1].wait(15) == 0);
  check_consecutive_steps(r, steps);
  replica_recovery(c.metrics_file, "n2");
  bool migrated = false;
  std::ifstream metrics(c.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "migration" && j.value("ok", false))
      migrated = migrated || j["moves"].get<std::string>().find("wpe: n0 -> n1") != std::string::npos;
  }
  CHECK(migrated);
  const auto reference = losses_of(session(tiny_config(steps, 4)).train());
  const auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-5 * std::abs(reference[i]));
}
