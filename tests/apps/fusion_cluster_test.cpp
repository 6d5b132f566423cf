// fusion-cluster plan as a user runs it: a paper-scale cluster of stated GPUs, text and JSON,
// OP-Fence against even, and the usage mistakes it refuses; certs and the files it writes.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "tests/support/fixtures.hpp"

namespace {

using fusion::test::run_in_source;

std::string cluster_bin() { return std::string(FUSION_BINARY_DIR) + "/apps/fusion-cluster"; }

}  // namespace

TEST_CASE("apps/fusion-cluster: plan predicts a 48-GPU cluster, in JSON and as a table") {
  const std::string args =
      " plan configs/clusters/paper-48-b.pbtxt --model configs/models/gpt2-124m.pbtxt --train.batch 32 "
      "--train.micro-batches 8";
  // The JSON of the replica-aware policy: replicas, nodes used and the pipeline-only prediction.
  auto json_run = run_in_source(cluster_bin() + args + " --cluster.policy opfence-replicas --json");
  INFO(json_run.output);
  REQUIRE(json_run.status == 0);
  auto j = nlohmann::json::parse(json_run.output.substr(json_run.output.find('{')));
  CHECK(j["micro_batches"] == 8);
  CHECK(j["micro_batch_rows"] == 4);
  CHECK(j["step_s"].get<double>() > 0);
  CHECK(j["tokens_per_s"].get<double>() > 0);
  // The schedule auto chose has the fastest prediction, and step_s is its prediction.
  auto& by = j["schedule_step_s"];
  const double fastest = std::min({by["eager"].get<double>(), by["gpipe"].get<double>(), by["1f1b"].get<double>()});
  CHECK(by[j["schedule"].get<std::string>()].get<double>() == doctest::Approx(fastest));
  CHECK(j["step_s"].get<double>() == doctest::Approx(fastest));
  // --train.allreduce f16 on a plan with replicas (paper-48-a, gpt2-124m: stages of 2-3 GPUs):
  // the same plan, its ring carrying about half the bytes, and a step no slower. (The capped CPU
  // topologies keep pipelines since the estimator models their CPU quotas: docs/scheduler.md.)
  auto ring = [&](const char* values) {
    auto r = run_in_source(cluster_bin() +
                           " plan configs/clusters/paper-48-a.pbtxt --model configs/models/gpt2-124m.pbtxt "
                           "--train.batch 32 --train.micro-batches 8 --cluster.policy opfence-replicas --json "
                           "--train.allreduce " + values);
    INFO(r.output);
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.output.substr(r.output.find('{')));
  };
  const auto r32 = ring("f32"), r16 = ring("f16");
  REQUIRE(r32["allreduce_bytes"].get<double>() > 0);
  CHECK(r16["nodes_used"] == r32["nodes_used"]);
  CHECK(r16["allreduce_bytes"].get<double>() < 0.6 * r32["allreduce_bytes"].get<double>());
  CHECK(r16["step_s"].get<double>() <= r32["step_s"].get<double>() * (1 + 1e-9));
  // --train.sync local:20: the ring runs once every 20 steps, so its bytes per step are 1/20 of
  // a plan's (OP-Fence may then choose other replicas: 196 MB on 8 GPUs against 1,304 MB on
  // 10), and the plan is predicted no slower.
  const auto local20 = ring("f32 --train.sync local:20");
  CHECK(local20["allreduce_bytes"].get<double>() > 0);
  CHECK(local20["allreduce_bytes"].get<double>() < r32["allreduce_bytes"].get<double>() / 4);
  CHECK(local20["step_s"].get<double>() <= r32["step_s"].get<double>() * (1 + 1e-9));
  REQUIRE(!j["fences"].empty());
  CHECK(j["chain"].size() <= 48);
  // Every op on exactly one stage (a replica repeats its stage's ops); no stage beyond its node's
  // stated memory.
  std::set<std::string> ops;
  size_t count = 0;
  for (auto& s : j["stages"]) {
    CHECK(s["memory_bytes"].get<double>() <= s["capacity_bytes"].get<double>());
    if (s["replica"].get<int>() > 0) continue;
    for (auto& op : s["ops"]) ops.insert(op.get<std::string>());
    count += s["ops"].size();
  }
  CHECK(j["nodes_used"].get<int>() == static_cast<int>(j["stages"].size()));
  CHECK(j["pipeline_step_s"].get<double>() >= j["step_s"].get<double>());
  CHECK(count == ops.size());
  CHECK(ops.count("wte") == 1);
  CHECK(ops.count("loss") == 1);

  auto text = run_in_source(cluster_bin() + args);
  INFO(text.output);
  REQUIRE(text.status == 0);
  CHECK(text.output.find("policy opfence, rates stated by the cluster file") != std::string::npos);
  CHECK(text.output.find("fences:") != std::string::npos);
  CHECK(text.output.find("predicted step") != std::string::npos);
  CHECK(text.output.find("schedule: ") != std::string::npos);
  CHECK(text.output.find(" s under gpipe (peak node memory ") != std::string::npos);
  CHECK(text.output.find("replicas:") == std::string::npos);  // the default plans no replicas

  // The even baseline is predicted slower on this cluster of mixed GPUs and 8 Mbit/s links.
  auto even = run_in_source(cluster_bin() + args + " --cluster.policy even --json");
  REQUIRE(even.status == 0);
  auto je = nlohmann::json::parse(even.output.substr(even.output.find('{')));
  CHECK(je.count("fences") == 0);
  CHECK(je["step_s"].get<double>() > j["step_s"].get<double>());
}

TEST_CASE("apps/fusion-cluster: plan --train.micro-batches auto predicts every divisor and plans the fastest") {
  auto r = run_in_source(cluster_bin() +
                         " plan configs/clusters/sites-2-slow.pbtxt --model configs/models/gpt-char-small.pbtxt "
                         "--train.batch 16 --train.micro-batches auto");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const size_t line = r.output.find("micro-batches: ");
  REQUIRE(line != std::string::npos);
  const std::string said = r.output.substr(line, r.output.find('\n', line) - line);
  for (const char* m : {"M=1 ", "M=2 ", "M=4 ", "M=8 ", "M=16 "}) CHECK(said.find(m) != std::string::npos);
  CHECK(said.find("(auto: ") != std::string::npos);
  CHECK(said.find("shortest predicted step") != std::string::npos);
  // The plan below is made at the chosen count.
  const int chosen = std::stoi(said.substr(std::string("micro-batches: ").size()));
  CHECK(r.output.find("batch 16 = " + std::to_string(chosen) + " micro-batches") != std::string::npos);
  // --json says the same: the chosen count, the reason and every candidate's prediction.
  auto js = run_in_source(cluster_bin() +
                          " plan configs/clusters/sites-2-slow.pbtxt --model configs/models/gpt-char-small.pbtxt "
                          "--train.batch 16 --train.micro-batches auto --json");
  INFO(js.output);
  REQUIRE(js.status == 0);
  const auto j = nlohmann::json::parse(js.output.substr(js.output.find('{')));
  CHECK(j["micro_batches"].get<int>() == chosen);
  const auto& m = j.at("micro_batches_auto");
  CHECK(m["chosen"].get<int>() == chosen);
  CHECK(m["reason"].get<std::string>().find("shortest predicted step") != std::string::npos);
  REQUIRE(m["candidates"].size() == 5);
  double best = 1e30;
  for (auto& c : m["candidates"]) {
    CHECK(c["step_s"].get<double>() > 0);
    CHECK(c["fits"].get<bool>());
    best = std::min(best, c["step_s"].get<double>());
  }
  for (auto& c : m["candidates"])
    if (c["micro_batches"].get<int>() == chosen) CHECK(c["step_s"].get<double>() <= best * 1.01);
  // A fixed count has no such object.
  auto fixed = run_in_source(cluster_bin() +
                             " plan configs/clusters/sites-2-slow.pbtxt --model configs/models/gpt-char-small.pbtxt "
                             "--train.batch 16 --train.micro-batches 4 --json");
  REQUIRE(fixed.status == 0);
  CHECK(nlohmann::json::parse(fixed.output.substr(fixed.output.find('{'))).count("micro_batches_auto") == 0);
}

TEST_CASE("apps/fusion-cluster: plan refuses usage mistakes with exit 2 and a reason, a bad profile with 1") {
  struct bad {
    std::string args, says;
  };
  const std::vector<bad> cases = {
      {"plan configs/clusters/sites-3.pbtxt", "plan needs --model FILE"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --train.batch 10 "
       "--train.micro-batches 4",
       "--train.batch 10 is not a multiple of --train.micro-batches 4"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --cluster.policy evn",
       "--cluster.policy must be opfence, even, explicit or opfence-replicas, got 'evn' (did you mean 'even'?)"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --train.micro-batches 0",
       "--train.micro-batches needs an integer >= 1"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --batch 32",
       "--batch is no longer an option of plan: use --train.batch B and --train.micro-batches M"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --train.schedule zigzag",
       "--train.schedule must be eager, gpipe, 1f1b or auto, got 'zigzag'"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --train.allreduce bf16",
       "--train.allreduce must be f32 or f16, got 'bf16'"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --train.sync local:x",
       "--train.sync must be step or local:H with H a whole number >= 1, got 'local:x'"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --policy even",
       "--policy is no longer an option of plan: use --cluster.policy P"},
  };
  for (auto& c : cases) {
    auto r = run_in_source(cluster_bin() + " " + c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(r.output.find(c.says) != std::string::npos);
  }
  // A profile that does not load is a refused input (exit 1), as in fusion-train.
  auto r = run_in_source(cluster_bin() + " plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt "
                                         "--cluster.profile /nonexistent/p.json");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("cannot open profile '/nonexistent/p.json'") != std::string::npos);
}

TEST_CASE("apps/fusion-cluster: certs makes a CA and one identity per node, keys private, CA kept") {
  auto dir = fusion::test::temp_path("cluster-certs", "certs");
  std::filesystem::remove_all(dir);
  auto first = run_in_source(cluster_bin() + " certs configs/clusters/sites-3.pbtxt --out " + dir + " --days 30");
  INFO(first.output);
  REQUIRE(first.status == 0);
  CHECK(first.output.find("3 nodes, valid 30 days") != std::string::npos);
  CHECK(first.output.find("security.certs=" + dir) != std::string::npos);
  for (std::string stem : {"ca", "coordinator", "admin", "nodes/a1", "nodes/b1", "nodes/c1"}) {
    auto key = std::filesystem::status(dir + "/" + stem + ".key").permissions();
    CHECK(key == (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
    CHECK(std::filesystem::exists(dir + "/" + stem + ".pem"));
  }
  // A second run must not silently replace the CA that signed the certificates in use.
  auto again = run_in_source(cluster_bin() + " certs configs/clusters/sites-3.pbtxt --out " + dir);
  CHECK(again.status == 2);
  CHECK(again.output.find("ca.pem exists") != std::string::npos);
  CHECK(run_in_source(cluster_bin() + " certs configs/clusters/sites-3.pbtxt --out " + dir + " --force").status == 0);
  auto no_out = run_in_source(cluster_bin() + " certs configs/clusters/sites-3.pbtxt");
  CHECK(no_out.status == 2);
  CHECK(no_out.output.find("certs needs --out DIR") != std::string::npos);
  auto bad_file = run_in_source(cluster_bin() + " certs configs/clusters/missing.pbtxt --out " + dir + "-2");
  CHECK(bad_file.status == 1);
  CHECK(bad_file.output.find("missing.pbtxt") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("apps/fusion-cluster: check and netns show the nodes behind a firewall, and which pairs meet via CAF") {
  auto path = fusion::test::temp_path("cluster", "firewalled.pbtxt");
  {
    std::ofstream f(path);
    f << "name: \"fw\"\nsite { name: \"a\" }\nsite { name: \"b\" }\n"
         "node { name: \"a1\" site: \"a\" accept_inbound: false }\n"
         "node { name: \"a2\" site: \"a\" }\n"
         "node { name: \"b1\" site: \"b\" accept_inbound: false }\n";
  }
  auto check = run_in_source(cluster_bin() + " check " + path);
  INFO(check.output);
  REQUIRE(check.status == 0);
  CHECK(check.output.find("a1 (cpu, accepts no inbound) a2 (cpu)") != std::string::npos);
  CHECK(check.output.find("note: nodes 'a1', 'b1' accept no inbound connection: tensors between any two of them go "
                          "over CAF through the coordinator") != std::string::npos);
  auto netns = run_in_source(cluster_bin() + " netns " + path);
  INFO(netns.output);
  REQUIRE(netns.status == 0);
  CHECK(netns.output.find("firewalled a1\nfirewalled b1\n") != std::string::npos);
  CHECK(netns.output.find("firewalled a2") == std::string::npos);
}
