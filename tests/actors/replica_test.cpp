// Stage replicas executed (issue 29): replicated plans on fusion-node processes compute the
// losses of one process with the same global batch and micro-batches (the gradients of each op's
// replicas are summed by a ring all-reduce over the data channel), the replicas stay identical
// (every checkpoint compares their state, XXH64 per tensor), a replica's node lost with recovery
// off stops the run naming it with a checkpoint that resumes on a pipeline-only plan, and a plan where a replica
// would get no micro-batch is refused before any op runs.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/coordinator_state.hpp"
#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "core/checkpoint_dir.hpp"
#include "core/cluster.hpp"
#include "scheduler/profile.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using namespace fusion::test::cluster;
using json = nlohmann::json;

namespace {

// The summation order of a replica's gradients differs from one process's (each replica
// accumulates its own micro-batches, then the ring adds the replicas' sums), so losses agree to
// float rounding, not bit for bit.
constexpr double tolerance = 1e-5;

// gpt-char-tiny's two halves on explicit stages: the first on `first` (a node, then replica
// entries), the second on `second`.
std::string two_stages(const std::vector<std::string>& first, const std::vector<std::string>& second) {
  auto assign = [](const std::vector<std::string>& nodes, const std::string& ops) {
    std::string out = "assign { node: \"" + nodes[0] + "\"";
    for (size_t i = 1; i < nodes.size(); ++i) out += " replica: \"" + nodes[i] + "\"";
    return out + " " + ops + " } ";
  };
  return "placement { policy: \"explicit\" " +
         assign(first, "ops: \"wte\" ops: \"wpe\" ops: \"h0.*\"") +
         assign(second, "ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\"") + "}";
}

struct replicated_run {
  std::vector<double> losses;
  std::vector<step_record> steps;
  double val_loss = NAN;
  std::string checkpoint;
  std::string move_error;  // what the admin's `move wte n3` answered (n3 holds a later replica)
};

// Trains `c` on `n` node processes of `cluster`, checkpointing every 5 steps (each save compares
// every op's replicas), then evaluates.
replicated_run run_replicated(train_config c, const std::string& cluster, int n, const std::string& tag) {
  std::vector<child_process> nodes;
  on_nodes(c, cluster, n, nodes, tag);
  c.checkpoint_file = temp_path(tag + "-ckpt");
  std::filesystem::remove_all(c.checkpoint_file);
  c.checkpoint_every = 5;
  replicated_run out;
  {
    session s(c);
    train_result r = s.train();
    out.losses = losses_of(r);
    out.steps = r.steps;
    out.val_loss = s.evaluate().loss;
    out.move_error = command_error(s, "move", {"wte", "n3"});
  }
  out.checkpoint = latest_checkpoint(c.checkpoint_file);
  INFO(all_output(nodes));
  for (auto& node : nodes) CHECK(node.wait(15) == 0);
  return out;
}

void check_same_losses(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(got[i] - want[i]) <= tolerance);
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  MESSAGE("largest loss difference to one process: " << worst);
}

// Gradient bytes of the ops whose names start with one of `prefixes` ("" for all), from a
// checkpoint's parameters (its "op/param" tensors less the optimizer moments; not "@vocab").
double param_bytes(const checkpoint& ck, const std::vector<std::string>& prefixes) {
  double bytes = 0;
  for (auto& [name, t] : ck.tensors) {
    if (name.find('/') == std::string::npos || name[0] == '@') continue;
    const bool moment = name.size() > 2 && (name.compare(name.size() - 2, 2, ".m") == 0 ||
                                            name.compare(name.size() - 2, 2, ".v") == 0);
    const bool in = std::any_of(prefixes.begin(), prefixes.end(), [&](auto& p) { return name.rfind(p, 0) == 0; });
    if (!moment && in) bytes += 4.0 * static_cast<double>(t.numel());
  }
  return bytes;
}

// Every step record of a replicated run measured its all-reduce: `want_bytes` sent in all (each
// of an op's R replicas sends 2 (R - 1) chunks of P / R), per op one ring time and one work time
// per replica, an exposed time within the step.
void check_allreduce_measured(const std::vector<step_record>& steps, double want_bytes) {
  REQUIRE(!steps.empty());
  for (auto& rec : steps) {
    CAPTURE(rec.step);
    CHECK(static_cast<double>(rec.allreduce_bytes) == want_bytes);
    uint64_t per_op = 0;
    for (auto& op : rec.ops) {
      per_op += op.reduce_bytes;
      CHECK(op.reduce_s.size() == op.reduce_work_s.size());
      for (double s : op.reduce_s) CHECK((s > 0 && s < rec.step_s));
    }
    if (rec.ops.empty()) continue;  // the oldest kept steps drop their per-op measurements
    CHECK(per_op == rec.allreduce_bytes);
    CHECK(rec.allreduce_work_s > 0);
    CHECK(rec.allreduce_exposed_s >= 0);
    CHECK(rec.allreduce_exposed_s < rec.step_s);
  }
}

}  // namespace

TEST_CASE("replicas: 2 stages x 2 replicas, and 3 + 1, train the losses of one process, replicas identical") {
  auto c = tiny_config(10, 4);
  c.eval_batches = 2;
  train_result ref;
  double ref_val = NAN;
  std::vector<std::string> ref_names;
  checkpoint ref_ck;
  {
    auto one_c = c;
    one_c.checkpoint_file = temp_path("replica-reference-ckpt");
    std::filesystem::remove_all(one_c.checkpoint_file);
    session one(one_c);
    ref = one.train();
    ref_val = one.evaluate().loss;
    ref_ck = load_checkpoint(latest_checkpoint(one_c.checkpoint_file));
    for (auto& [name, t] : ref_ck.tensors) ref_names.push_back(name);
  }
  struct variant {
    const char* name;
    std::string placement;
    double allreduce_bytes;  // per step
  };
  const std::vector<variant> variants = {
      {"replicas-2x2", two_stages({"n0", "n1"}, {"n2", "n3"}), 2 * param_bytes(ref_ck, {""})},
      {"replicas-1-3", two_stages({"n0"}, {"n1", "n2", "n3"}), 4 * param_bytes(ref_ck, {"h1.", "lnf/", "lm_head/"})},
  };
  for (auto& v : variants) {
    std::string name = v.name;
    CAPTURE(name);
    auto got = run_replicated(c, write_cluster(v.name, 4, v.placement), 4, v.name);
    check_same_losses(got.losses, losses_of(ref));
    check_allreduce_measured(got.steps, v.allreduce_bytes);
    // Evaluation routes micro-batches 1 and 3 through other replicas than 0 and 2: the same
    // loss only if every replica holds the same weights.
    CHECK(std::abs(got.val_loss - ref_val) <= tolerance);
    // Ops do not move onto a node that holds a later replica of a stage, and the answer says so.
    CHECK(got.move_error.find("node 'n3' holds replica") != std::string::npos);
    CHECK(got.move_error.find("'replicas' changes a stage's replicas") != std::string::npos);
    // The checkpoints of steps 5 and 10 compared every replica's state (a divergence fails the
    // save and the run) and hold one copy per op: the tensors of a one-process checkpoint.
    REQUIRE(!got.checkpoint.empty());
    checkpoint ck = load_checkpoint(got.checkpoint);
    CHECK(ck.step == 10);
    std::vector<std::string> names;
    for (auto& [tensor_name, t] : ck.tensors) names.push_back(tensor_name);
    CHECK(names == ref_names);
  }
}

TEST_CASE("replicas: added, re-ordered and dropped at step boundaries, the losses stay those of one process") {
  const int steps = 10;
  auto c = tiny_config(steps, 4);
  const auto want = losses_of(session(c).train());
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster("replicas-live", 4, two_stages({"n0"}, {"n2"})), 4, nodes, "replicas-live");
  c.checkpoint_file = temp_path("replicas-live-ckpt");
  std::filesystem::remove_all(c.checkpoint_file);
  c.checkpoint_every = 5;  // each save compares every op's replicas bit for bit
  std::vector<double> got;
  int first_at = 0, second_at = 0;
  {
    session s(c);
    train_result r;
    std::thread trainer([&] { r = s.train(); });
    wait_for_step(s, 2);
    // Paused, applied at once: both stages get a replica (the pipeline becomes 2 x 2). Every
    // arriving replica carries its op's state from replica 0.
    first_at = json::parse(s.command("pause"))["step"].get<int>();
    auto a = json::parse(s.command("replicas", {"h1.fc", "n2,n3"}));
    CHECK(a["ok"] == true);
    CHECK(a["state_bytes"].get<uint64_t>() > 100000);
    auto b = json::parse(s.command("replicas", {"wte", "n0,n1"}));
    CHECK(b["ok"] == true);
    CHECK(s.query("placement").find("\"dir\":\"reduce\"") != std::string::npos);
    s.command("resume");
    // Training, applied at the next step boundary: stage 2's replicas swap roles (no state moves:
    // the actors stay and take their new replica index, ring and micro-batches), stage 1 drops
    // n0 and keeps n1's actors as its only replica.
    wait_for_step(s, 6);
    auto d = json::parse(s.command("replicas", {"lm_head", "n3,n2"}));
    CHECK(d["ok"] == true);
    CHECK(d["state_bytes"].get<uint64_t>() == 0);
    second_at = d["step"].get<int>();
    auto e = json::parse(s.command("replicas", {"h0.fc", "n1"}));
    CHECK(e["ok"] == true);
    CHECK(e["state_bytes"].get<uint64_t>() == 0);
    // A bad replica set is refused in plain words, and nothing changes.
    const std::string twice = command_error(s, "replicas", {"lnf", "n3,n3"});
    CHECK(twice.find("node 'n3' is named twice") != std::string::npos);
    trainer.join();
    got = losses_of(r);
  }
  INFO(all_output(nodes));
  MESSAGE("replica sets changed after steps " << first_at << " and " << second_at);
  CHECK(first_at >= 2);
  CHECK(second_at > first_at);
  CHECK(second_at < steps);
  check_same_losses(got, want);
  CHECK(load_checkpoint(latest_checkpoint(c.checkpoint_file)).step == steps);
  for (auto& n : nodes) CHECK(n.wait(15) == 0);
}

TEST_CASE("replicas: an f16 all-reduce keeps the replicas identical and the losses close to f32") {
  auto c = tiny_config(6, 4);
  c.eval_batches = 2;
  const auto f32_losses = losses_of(session(c).train());
  c.compression.allreduce = value_type::f16;
  // The checkpoints of steps 5 and 6 compare every replica's parameters and Adam moments bit for
  // bit (a divergence fails the run); evaluation routes micro-batches through both replicas.
  auto got = run_replicated(c, write_cluster("replicas-f16", 4, two_stages({"n0", "n1"}, {"n2", "n3"})), 4,
                            "replicas-f16");
  REQUIRE(!got.checkpoint.empty());
  CHECK(load_checkpoint(got.checkpoint).step == 6);
  REQUIRE(got.losses.size() == f32_losses.size());
  double worst = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) worst = std::max(worst, std::abs(got.losses[i] - f32_losses[i]));
  MESSAGE("largest loss difference of the f16 all-reduce to f32: " << worst);
  CHECK(worst < 1e-2);
  CHECK(worst > 0);  // the sums were rounded: not the f32 run
  // Half the f32 ring's value bytes: 2 P x 1/2 for a ring of two.
  check_allreduce_measured(got.steps, param_bytes(load_checkpoint(got.checkpoint), {""}));
}

TEST_CASE("replicas: policy opfence-replicas runs the replicas it plans") {
  // Three slow nodes on one site with stated rates, given as the profile (no measuring at join):
  // OP-Fence with replicas holds the model's heavy stage on several of them.
  const std::string text =
      "name: \"replica-policy\"\ncoordinator { host: \"127.0.0.1\" port: 0 }\nsite { name: \"s\" }\n"
      "node { name: \"n0\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n"
      "node { name: \"n1\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n"
      "node { name: \"n2\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n";
  const auto cluster = temp_path("replica-policy.pbtxt");
  std::ofstream(cluster) << text;
  const auto profile = temp_path("replica-policy.profile");
  save_profile(profile, profile_from_cluster(load_cluster(cluster)));
  auto c = tiny_config(4, 4);
  const auto want = losses_of(session(c).train());
  c.profile_file = profile;
  c.policy = "opfence-replicas";
  std::vector<child_process> nodes;
  on_nodes(c, cluster, 3, nodes, "replica-policy");
  c.metrics_file = temp_path("replica-policy.jsonl");
  std::filesystem::remove(c.metrics_file);
  std::vector<double> got;
  {
    session s(c);
    got = losses_of(s.train());
    // The placement query lists every replica's node of a replicated op.
    const std::string placement = s.query("placement");
    CHECK(placement.find("\"replicas\"") != std::string::npos);
    CHECK(placement.find("\"dir\":\"reduce\"") != std::string::npos);
    CHECK(s.query("ops").find("\"replicas\"") != std::string::npos);
  }
  INFO(all_output(nodes));
  check_same_losses(got, want);
  for (auto& n : nodes) CHECK(n.wait(15) == 0);
}

TEST_CASE("replicas: a replica too slow to be dealt a micro-batch is named, not the micro-batch count blamed") {
  const cluster_spec c = parse_cluster("name: \"r\"\nsite { name: \"s\" }\nnode { name: \"a\" site: \"s\" }\n"
                                       "node { name: \"b\" site: \"s\" }\nnode { name: \"c\" site: \"s\" }\n",
                                       "r.pbtxt");
  placement where({0, 1, 1});
  where.stages = {{{0}, {1.0}}, {{1, 2}, {10.0, 1.0}}};  // c a tenth as fast as b
  where.stage_of_op = {0, 1, 1};
  where.routes = deal_routes(where.stages, 4);
  std::string error;
  try {
    check_replica_routes(where, 4, c);
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.find("the stage on nodes b, c deals a step's 4 micro-batches by its replicas' measured speeds, and "
                   "node 'c' is too slow to get one") != std::string::npos);
  where.routes = deal_routes(where.stages, 11);  // enough for c's share
  CHECK_NOTHROW(check_replica_routes(where, 11, c));
}

TEST_CASE("replicas: a stage with more replicas than micro-batches is refused before any op runs") {
  auto c = tiny_config(2, 2);
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster("replica-short", 4, two_stages({"n0"}, {"n1", "n2", "n3"})), 4, nodes, "replica-short");
  std::string error;
  try {
    session s(c);
    s.train();
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.find("the stage on nodes n1, n2, n3 has 3 replicas") != std::string::npos);
  CHECK(error.find("raise train.micro-batches to at least 3") != std::string::npos);
  for (auto& n : nodes) CHECK(n.wait(15) >= 0);  // told to stop, not left waiting for ops
}

TEST_CASE("replicas: with recovery off, a replica's node killed mid-run stops the run naming it, and the checkpoint resumes on a pipeline") {
  const std::string tag = "replica-kill";
  auto c = tiny_config(100000, 4);
  c.recovery_mode = "off";  // with recovery on, the run goes on: tests/actors/recovery_test.cpp
  std::vector<child_process> nodes;
  on_nodes(c, write_cluster(tag, 4, two_stages({"n0", "n1"}, {"n2", "n3"})), 4, nodes, tag);
  c.checkpoint_file = temp_path(tag + "-ckpt");
  std::filesystem::remove_all(c.checkpoint_file);
  c.checkpoint_every = 2;
  std::mutex mutex;
  std::map<int64_t, double> losses;  // step -> loss of the replicated run
  std::atomic<int64_t> reached{0};
  c.on_step = [&](const step_record& rec, double) {
    std::lock_guard<std::mutex> lock(mutex);
    losses[rec.step] = rec.loss;
    reached = rec.step;
  };
  std::string error;
  {
    session s(c);
    std::atomic<bool> done{false};
    std::thread killer([&] {
      while (!done && reached < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!done) nodes[3].signal(SIGKILL);  // n3: replica 1 of the second stage
    });
    try {
      s.train();
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
    killer.join();
  }
  INFO(error);
  CHECK(error.find("node 'n3'") != std::string::npos);
  CHECK(error.find("last checkpoint") != std::string::npos);
  for (int i : {0, 1, 2}) CHECK(nodes[i].wait(15) >= 0);

  // The checkpoint holds one copy per op: it resumes on two nodes without replicas, and the
  // resumed steps compute what the replicated run computed for them (same state, same batches).
  const std::string latest = latest_checkpoint(c.checkpoint_file);
  REQUIRE(!latest.empty());
  const auto at = static_cast<int64_t>(load_checkpoint(latest).step);
  CHECK(at >= 2);
  auto resume = tiny_config(at + 2, 4);
  resume.resume_from = latest;
  std::vector<child_process> pipeline;
  on_nodes(resume, write_cluster(tag + "-pipeline", 2, "placement { policy: \"even\" }"), 2, pipeline, tag + "-p");
  train_result r;
  {
    session again(resume);
    CHECK(again.step() == at);
    r = again.train();
  }
  REQUIRE(r.steps.size() == 2);
  CHECK(r.steps[0].step == at + 1);
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& rec : r.steps) {
    CHECK(std::isfinite(rec.loss));
    if (losses.count(rec.step)) CHECK(std::abs(rec.loss - losses[rec.step]) <= tolerance);
  }
  for (auto& n : pipeline) CHECK(n.wait(15) == 0);
}
