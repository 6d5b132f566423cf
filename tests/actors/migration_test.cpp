// Live migration (actors/coordinator_migrate.cpp) on fusion-node processes: ops moved with their
// state at two step boundaries leave losses and state bit-identical to an undisturbed run, a
// checkpoint written after the moves resumes exactly, a target lost during the transfer leaves
// the old placement running, and every error of the `move` command is said in plain words.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "actors/trainer.hpp"
#include "core/checkpoint.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using namespace fusion::test::cluster;
using fusion::test::child_process;
using fusion::test::losses_of;
using json = nlohmann::json;

namespace {

// Embeddings on n0, block 0 on n1, block 1 and the head on n2 (n3, when there is one, idle).
const std::string three_stages =
    "placement { policy: \"explicit\" assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" } "
    "assign { node: \"n1\" ops: \"h0.*\" } "
    "assign { node: \"n2\" ops: \"h1.*\" ops: \"lnf\" ops: \"lm_head\" ops: \"loss\" } }";

std::string node_of(session& s, const std::string& op) {
  const auto placement = json::parse(s.query("placement"));
  for (auto& o : placement["ops"])
    if (o["op"] == op) return o["node"].get<std::string>();
  return "?";
}

}  // namespace

TEST_CASE("migration: ops moved at two step boundaries keep losses and state bit-identical, the checkpoint resumes") {
  const int steps = 10;
  const auto still_ckpt = temp_path("still.ckpt"), moved_ckpt = temp_path("moved.ckpt");
  std::vector<double> undisturbed, moved;
  {
    std::vector<child_process> nodes;
    auto c = tiny_config(steps, 2);
    on_nodes(c, write_cluster("still", 3, three_stages), 3, nodes, "still");
    session s(c);
    undisturbed = losses_of(s.train());
    s.save_checkpoint(still_ckpt);
  }
  int first_at = 0, second_at = 0;
  {
    std::vector<child_process> nodes;
    auto c = tiny_config(steps, 2);
    on_nodes(c, write_cluster("moved", 3, three_stages), 3, nodes, "moved");
    session s(c);
    train_result r;
    std::thread trainer([&] { r = s.train(); });
    // First while paused (applied at once): h0.res1 (fan-in from wpe and h0.proj, fan-out to
    // h0.ln2 and h0.res2) and h0.ln2 (parameters) go to n2: proj -> res1 becomes remote.
    wait_for_step(s, 3);
    first_at = json::parse(s.command("pause"))["step"].get<int>();
    auto a = json::parse(s.command("move", {"h0.res1", "n2"}));
    CHECK(a["ok"] == true);
    CHECK(a["state_bytes"].get<uint64_t>() == 0);  // an add has no state
    auto b = json::parse(s.command("move", {"h0.ln2", "n2"}));
    CHECK(b["ok"] == true);
    // LayerNorm over 64 channels: weight and bias with two Adam moments each.
    CHECK(b["state_bytes"].get<uint64_t>() == 2 * 3 * 64 * 4);
    CHECK(node_of(s, "h0.res1") == "n2");
    CHECK(node_of(s, "h0.ln2") == "n2");
    CHECK(step_of(s) == first_at);  // nothing ran while paused
    s.command("resume");
    // Second while training (applied at the next step boundary): block 1 goes to n1, so
    // h0.res2 -> h1.ln1 becomes local.
    wait_for_step(s, 7);
    auto d = json::parse(s.command("move", {"h1.*", "n1"}));
    CHECK(d["ok"] == true);
    second_at = d["step"].get<int>();
    CHECK(d["state_bytes"].get<uint64_t>() > 100000);
    INFO(d["diff"].get<std::string>());
    // Block 1's 11 ops (its fan-out node h1.res1.fan too) and h0.res2.fan, which follows its
    // readers h1.ln1 and h1.res1.
    CHECK(d["diff"].get<std::string>().find("12 ops move (h0.res2.fan: n2 -> n1") != std::string::npos);
    trainer.join();
    CHECK(node_of(s, "h1.qkv") == "n1");
    CHECK(node_of(s, "lnf") == "n2");
    moved = losses_of(r);
    s.save_checkpoint(moved_ckpt);
  }
  MESSAGE("moves applied after steps " << first_at << " and " << second_at);
  CHECK(first_at >= 3);
  CHECK(second_at > first_at);
  CHECK(second_at < steps);
  REQUIRE(undisturbed.size() == static_cast<size_t>(steps));
  REQUIRE(moved.size() == static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    CAPTURE(i);
    CHECK(moved[i] == undisturbed[i]);  // bit for bit
  }
  // The moved ops' parameters and moments are exactly what an undisturbed run holds.
  auto still = load_checkpoint(still_ckpt), after = load_checkpoint(moved_ckpt);
  CHECK(after.step == still.step);
  REQUIRE(after.tensors.size() == still.tensors.size());
  for (auto& [name, t] : still.tensors) {
    CAPTURE(name);
    const tensor* m = find_tensor(after, name);
    REQUIRE(m != nullptr);
    REQUIRE(m->nbytes() == t.nbytes());
    CHECK(std::memcmp(m->bytes(), t.bytes(), t.nbytes()) == 0);
  }
  // The checkpoint written after the moves resumes: two more steps in one process match two
  // more steps of the undisturbed checkpoint.
  auto resume = [&](const std::string& ckpt) {
    auto c = tiny_config(steps + 2, 2);
    c.resume_from = ckpt;
    session s(c);
    return losses_of(s.train());
  };
  auto from_moved = resume(moved_ckpt), from_still = resume(still_ckpt);
  REQUIRE(from_moved.size() == 2);
  CHECK(from_moved == from_still);
}

TEST_CASE("migration: a target lost during the transfer leaves the old placement running, move errors are plain") {
  const int steps = 6;
  std::vector<child_process> nodes;
  auto c = tiny_config(steps, 2);
  on_nodes(c, write_cluster("lost", 4, three_stages), 4, nodes, "lost");
  std::vector<double> got;
  {
    session s(c);
    train_result r;
    std::thread trainer([&] { r = s.train(); });
    wait_for_step(s, 2);
    s.command("pause");
    // Each error names what is wrong.
    CHECK(command_error(s, "move", {"h1.*"}).find("usage: move OP|GLOB NODE") != std::string::npos);
    CHECK(command_error(s, "move", {"nosuch*", "n1"}).find("no op of model gpt-char-tiny matches 'nosuch*'") !=
          std::string::npos);
    CHECK(command_error(s, "move", {"h1.*", "n9"}).find("unknown node 'n9' (nodes: n0, n1, n2, n3)") !=
          std::string::npos);
    CHECK(command_error(s, "move", {"h1.*", "n2"}).find("already run(s) on node 'n2'") != std::string::npos);
    // n3 hangs (SIGSTOP) before the state reaches it: the coordinator declares it lost after
    // the peer timeout and abandons the migration; nothing of the old placement moved.
    REQUIRE(::kill(nodes[3].pid(), SIGSTOP) == 0);
    auto lost = command_error(s, "move", {"h1.*", "n3"});
    INFO(lost);
    CHECK(lost.find("abandoned") != std::string::npos);
    CHECK(lost.find("node 'n3' (site s3) was lost") != std::string::npos);
    CHECK(lost.find("the run goes on with the old placement") != std::string::npos);
    CHECK(node_of(s, "h1.qkv") == "n2");
    CHECK(command_error(s, "move", {"h1.*", "n3"}).find("node 'n3' is lost") != std::string::npos);
    s.command("resume");
    trainer.join();
    got = losses_of(r);
  }
  ::kill(nodes[3].pid(), SIGKILL);
  // The run went on: every step, the same losses as one process.
  const auto reference = losses_of(session(tiny_config(steps, 2)).train());
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - reference[i]) <= 1e-6 * std::abs(reference[i]));
}
