// Automatic recovery from a lost node (docs/recovery.md), against real fusion-node processes: a
// node SIGKILLed mid-step is recovered from the last checkpoint on the survivors, ending with the
// weights of a run resumed by hand from that checkpoint on the same survivor plan; a replica's
// node hung (SIGSTOP) costs no checkpoint and at most the step in flight, the losses staying
// those of an undisturbed run; a loss with nothing to recover from fails naming why, writing nothing.
// With peer-held snapshots every step and no checkpoint, a SIGKILLed node costs at most the step in
// flight and the run ends with the weights of one resumed by hand from that step's state.
// Nodes started with cluster.rejoin-timeout outlive their coordinator and rejoin the one that
// resumes the run from its checkpoint.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "core/checkpoint_dir.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/profile.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"
#include "tests/support/recovery_fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using fusion::test::src;
using namespace fusion::test::cluster;
using namespace fusion::test::recovery;

namespace {

// A TCP port nothing listens on right now (the coordinator of the rejoin test needs a fixed one).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  uint16_t port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

bool wait_for_text(const child_process& p, const std::string& text, double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 50); ++i) {
    if (p.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
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
  CHECK(max_weight_difference(mine, theirs) <= 1e-6);
}

TEST_CASE("recovery: with snapshots every step and no checkpoint, a killed node costs at most the step in flight and the weights are those of a run resumed by hand") {
  const std::string tag = "rec-snap";
  const int64_t steps = 10;
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  // One node per site: n0's ops are held on n1, n1's on n2, n2's on n0.
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  c.recovery_mode = "auto";
  c.snapshot_every = 1;
  c.checkpoint_file = temp_path(tag + "-final.ckpt");  // written at the end only: nothing to recover from
  c.checkpoint_every = 0;
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.checkpoint_file);
  std::filesystem::remove(c.metrics_file);
  killer k{&nodes, 1, 5};
  c.on_step = [&](const step_record& rec, double) {
    // The kill comes once step 5's snapshot has had time to reach its buddy (milliseconds on
    // loopback): a snapshot still on its way when a node dies costs one step more.
    if (rec.step == 5) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    k.on_step(rec);
  };
  train_result r;
  {
    session s(c);
    r = s.train();
  }
  INFO(all_output(nodes));
  REQUIRE(k.killed);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[2].wait(15) == 0);
  check_consecutive_steps(r, steps);
  CHECK(k.seconds_to_next_step() < 20);
  auto recs = recovery_records(c.metrics_file);
  REQUIRE(recs.size() == 1);
  const auto& rec = recs[0];
  INFO(rec.dump());
  CHECK(rec["nodes"] == nlohmann::json::array({"n1"}));
  CHECK(rec["state_from"] == "snapshots");
  CHECK(rec["checkpoint"] == "");
  CHECK(rec["held_by"].get<std::string>().find("n2") != std::string::npos);  // n1's ops were held there
  const int64_t from = rec["step"].get<int64_t>();
  CHECK(from == rec["detected_step"].get<int64_t>());
  CHECK(from == 5);
  CHECK(rec["steps_lost"].get<int64_t>() <= 1);

  // By hand: the state of step `from` (an undisturbed one-process run's checkpoint of that step)
  // resumed on the survivors' plan (even over two nodes) to the same step.
  auto ref = tiny_config(steps, 2);
  ref.checkpoint_file = temp_path(tag + "-ref-ckpt");
  ref.checkpoint_every = 1;
  ref.keep_checkpoints = 0;
  std::filesystem::remove_all(ref.checkpoint_file);
  session(ref).train();
  auto h = tiny_config(steps, 2);
  h.resume_from = (std::filesystem::path(ref.checkpoint_file) / checkpoint_file_name(from)).string();
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
  const checkpoint mine = load_checkpoint(c.checkpoint_file);
  CHECK(mine.step == static_cast<uint64_t>(steps));
  CHECK(max_weight_difference(mine, load_checkpoint(h.checkpoint_file)) <= 1e-6);
}

TEST_CASE("recovery: after a checkpoint is loaded mid-run, a lost node rewinds to a snapshot taken since, not to a step the load undid") {
  const std::string tag = "rec-snap-load";
  const int64_t steps = 6, loaded = 3;
  // The state of step 3 and the losses every step must have: an undisturbed one-process run.
  auto ref = tiny_config(steps, 2);
  ref.checkpoint_file = temp_path(tag + "-ref-ckpt");
  ref.checkpoint_every = 1;
  ref.keep_checkpoints = 0;
  std::filesystem::remove_all(ref.checkpoint_file);
  const auto reference = losses_of(session(ref).train());
  auto c = tiny_config(steps, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 3, "placement { policy: \"even\" }"), 3, nodes, tag);
  c.recovery_mode = "auto";
  c.snapshot_every = 1;
  c.checkpoint_every = 0;
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  bool again = false;
  killer k{&nodes, 1, loaded + 2};
  c.on_step = [&](const step_record& rec, double) {
    if (!again) return;
    if (rec.step == k.at) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its snapshot arrives
    k.on_step(rec);
  };
  train_result r;
  {
    session s(c);
    s.train();  // every holder now has the snapshot of step 6
    s.load_checkpoint((std::filesystem::path(ref.checkpoint_file) / checkpoint_file_name(loaded)).string());
    REQUIRE(s.step() == loaded);
    again = true;
    r = s.train();  // steps 4-6 again; n1 killed after step 5
  }
  INFO(all_output(nodes));
  REQUIRE(k.killed);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[2].wait(15) == 0);
  // Before holders were made anew on a load, they refused the snapshots of steps 4-6 (older than
  // the one of step 6 they held) and the recovery brought back step 6 of before the load.
  auto recs = recovery_records(c.metrics_file);
  REQUIRE(recs.size() == 1);
  INFO(recs[0].dump());
  CHECK(recs[0]["state_from"] == "snapshots");
  // Step 5's snapshot, or step 4's if 5's was still on its way to its buddy: never step 6.
  const int64_t from = recs[0]["step"].get<int64_t>();
  CHECK(from > loaded);
  CHECK(from <= recs[0]["detected_step"].get<int64_t>());
  CHECK(recs[0]["steps_lost"].get<int64_t>() <= 2);
  REQUIRE(r.steps.size() == static_cast<size_t>(steps - loaded));
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const auto& step = r.steps[i];
    CHECK(step.step == loaded + 1 + static_cast<int64_t>(i));
    CHECK(std::abs(step.loss - reference[step.step - 1]) <= 1e-5 * std::abs(reference[step.step - 1]));
  }
}

TEST_CASE("recovery: a replica's node hung (SIGSTOP) costs no checkpoint and at most the step in flight, the losses unchanged") {
  const std::string tag = "rec-replica";
  const int64_t steps = 10;
  auto c = tiny_config(steps, 4);
  std::vector<child_process> nodes;
  // Two stages: the first on n0, the second on n1 with a replica on n2.
  on_nodes(c, write_cluster(tag, 3, replica_placement()), 3, nodes, tag);
  c.recovery_mode = "auto";  // no checkpoint is kept: the replica is the only source
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  killer k{&nodes, 2, 4, SIGSTOP};  // declared lost after the peer timeout (1 s here)
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
  CHECK(k.seconds_to_next_step() < 20);
  check_consecutive_steps(r, steps);
  const auto rec = replica_recovery(c.metrics_file, "n2");
  INFO(rec.dump());
  CHECK(rec["checkpoint"] == "");
  CHECK(rec["steps_lost"].get<int64_t>() <= 1);
  CHECK(rec["note"].get<std::string>().find("replica on lost node 'n2' dropped") != std::string::npos);
  // The survivors held the state of the last step: every loss is an undisturbed run's (one
  // process, the same batches), as a run resumed by hand from that state would compute them.
  const auto reference = losses_of(session(tiny_config(steps, 4)).train());
  const auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-5 * std::abs(reference[i]));
}

namespace {

// Stage 1 on n0, stage 2 on n1 with a replica on n2, from a profile in which n1 runs every op
// `n1_slower` times as long as n0 and n2: at step 2 the run pauses, n2 hangs (SIGSTOP) and n0 is
// drained, which re-plans on n1 and n2 (OP-Fence) and migrates n0's stage. Returns the drain's
// error; the run must recover from n2's loss and train every step with an undisturbed run's losses.
std::string drain_while_replica_hangs(const std::string& tag, double n1_slower) {
  const int64_t steps = 8;
  auto c = tiny_config(steps, 4);
  const std::string cluster =
      write_cluster(tag, 3, replica_placement());
  const graph g = load_graph(c.model_file, c.batch / c.micro_batches);
  cluster_profile p = profile_from_cluster(load_cluster(cluster));
  p.model = g.name;
  p.micro_batch = c.batch / c.micro_batches;
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    const double f = n == 1 ? n1_slower : 1.0;
    for (int id : distinct_ops(g)) p.nodes[n].ops[op_key(g, id)] = op_timing{0.001 * f, 0.002 * f, 0.0002 * f};
  }
  c.profile_file = temp_path(tag + "-profile.json");
  save_profile(c.profile_file, p);
  std::vector<child_process> nodes;
  on_nodes(c, cluster, 3, nodes, tag);
  c.recovery_mode = "auto";
  c.metrics_file = temp_path(tag + ".jsonl");
  std::filesystem::remove(c.metrics_file);
  train_result r;
  std::string drained;
  {
    session s(c);
    std::string failure;
    std::thread trainer([&] {
      try {
        r = s.train();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
    wait_for_step(s, 2);
    s.command("pause");
    REQUIRE(::kill(nodes[2].pid(), SIGSTOP) == 0);
    drained = command_error(s, "drain", {"n0"});
    const std::string resumed = command_error(s, "resume", {});
    trainer.join();
    CHECK_MESSAGE(resumed.empty(), resumed);
    REQUIRE_MESSAGE(failure.empty(), failure);
  }
  ::kill(nodes[2].pid(), SIGKILL);
  INFO(drained);
  CHECK(drained.find("abandoned") != std::string::npos);
  CHECK(drained.find("the run recovers on the surviving nodes") != std::string::npos);
  CHECK(nodes[0].wait(15) == 0);
  CHECK(nodes[1].wait(15) == 0);
  check_consecutive_steps(r, steps);
  replica_recovery(c.metrics_file, "n2");
  // Paused at a step boundary, nothing was in flight: every loss is an undisturbed run's.
  const auto reference = losses_of(session(tiny_config(steps, 4)).train());
  const auto got = losses_of(r);
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-5 * std::abs(reference[i]));
  return drained;
}

}  // namespace

TEST_CASE("recovery: a replica's node lost while a migration sends it state is recovered from, the migration abandoned") {
  // n1 slow: part of n0's stage goes to n2, whose transfer never completes. The coordinator once
  // only abandoned the migration, as n2 held no stage's first replica, and the run then failed
  // on the dead replica.
  const std::string drained = drain_while_replica_hangs("rec-move-target", 2.5);
  CHECK(drained.find("-> n2") != std::string::npos);
}

TEST_CASE("recovery: a replica's node lost while a migration wires its new plan is recovered from the plan it left") {
  // Every node as fast: n0's stage goes to n1 alone, its transfer completes and the migration
  // switches to the new plan, whose wiring then waits for n2. The recovery once judged the
  // survivors by the new plan, where ops ran only on n2, and failed the run although n1 still
  // held their replicas.
  const std::string drained = drain_while_replica_hangs("rec-move-switched", 1.0);
  CHECK(drained.find("-> n1") != std::string::npos);
  CHECK(drained.find("-> n2") == std::string::npos);
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

TEST_CASE("recovery: nodes with cluster.rejoin-timeout outlive a killed coordinator and rejoin the one that resumes") {
  const std::string tag = "rec-rejoin";
  const uint16_t port = free_port();
  REQUIRE(port != 0);
  const std::string cluster = temp_path(tag + ".pbtxt");
  {
    std::ofstream out(cluster);
    out << "name: \"" << tag << "\"\ncoordinator { host: \"127.0.0.1\" port: " << port << " }\n";
    for (int i = 0; i < 2; ++i)
      out << "site { name: \"s" << i << "\" }\nnode { name: \"n" << i << "\" site: \"s" << i << "\" device: \"cpu\" }\n";
    out << "placement { policy: \"even\" }\n";
  }
  const std::string ckpt = temp_path(tag + "-ckpt");
  std::filesystem::remove_all(ckpt);
  auto train = [&](const std::vector<std::string>& extra, const std::string& log) {
    std::vector<std::string> args = {std::string(FUSION_BINARY_DIR) + "/apps/fusion-train", "--config",
                                     src("configs/runs/char-tiny.ini"), "--cluster", cluster,
                                     "--train.eval-batches=0", "--output.sample-chars=0", "--output.metrics=\"\"",
                                     "--output.checkpoint=" + ckpt, "--output.checkpoint-every=2", "--train.log-every=1",
                                     "--cluster.heartbeat-ms=100", "--cluster.peer-timeout-ms=1000",
                                     fusion::test::certs_arg()};
    args.insert(args.end(), extra.begin(), extra.end());
    return child_process(args, temp_path(log), FUSION_SOURCE_DIR);
  };
  auto first = train({"--steps", "100000"}, tag + "-first.log");
  REQUIRE(wait_for_text(first, "waiting for 2 node(s)", 30));
  std::vector<child_process> nodes;
  for (int i = 0; i < 2; ++i) {
    const std::string name = "n" + std::to_string(i);
    nodes.emplace_back(std::vector<std::string>{std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                                                src("configs/nodes/site-a.ini"), "--node.name=" + name,
                                                "--node.coordinator=127.0.0.1:" + std::to_string(port),
                                                "--runtime.threads=1", "--node.join-timeout=20.0",
                                                "--cluster.rejoin-timeout=60.0", "--cluster.heartbeat-ms=100",
                                                "--cluster.peer-timeout-ms=1000", fusion::test::certs_arg()},
                       temp_path(tag + name + ".log"));
  }
  INFO(first.output());
  REQUIRE(wait_for_text(first, "step 5/", 60));
  first.signal(SIGKILL);
  first.wait(10);
  for (auto& n : nodes) CHECK(wait_for_text(n, "trying to rejoin the coordinator", 20));
  const std::string latest = latest_checkpoint(ckpt);
  REQUIRE(!latest.empty());
  const auto at = static_cast<int64_t>(load_checkpoint(latest).step);
  CHECK(at >= 4);
  auto second = train({"--steps", std::to_string(at + 3), "--train.resume=" + latest}, tag + "-second.log");
  const int status = second.wait(120);
  INFO(second.output());
  INFO(all_output(nodes));
  CHECK(status == 0);
  CHECK(second.output().find("node 'n0' (site s0) joined") != std::string::npos);
  CHECK(second.output().find("node 'n1' (site s1) joined") != std::string::npos);
  CHECK(second.output().find("step " + std::to_string(at + 3) + "/") != std::string::npos);
  for (auto& n : nodes) {
    CHECK(n.output().find("rejoined the coordinator") != std::string::npos);
    CHECK(n.wait(15) == 0);
  }
  CHECK(load_checkpoint(latest_checkpoint(ckpt)).step == static_cast<uint64_t>(at + 3));
}
