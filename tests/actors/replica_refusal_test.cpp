// Stage replicas are planned and predicted (fusion-cluster plan, the estimator) but not executed
// yet: a run whose plan has them, from the cluster file's replica entries or from policy
// opfence-replicas, fails before any op actor is spawned, with a message that says so and what
// to use instead, and the nodes exit instead of waiting.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "actors/trainer.hpp"
#include "core/cluster.hpp"
#include "scheduler/profile.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using namespace fusion::test::cluster;

namespace {

// Runs `c` on `n` node processes; returns the error it ended with ("" when it trained).
std::string run_error(train_config c, const std::string& cluster, int n, const std::string& tag,
                      std::vector<child_process>& nodes) {
  on_nodes(c, cluster, n, nodes, tag);
  try {
    session s(c);
    s.train();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cluster: a cluster file's replica entries are refused before any op runs, naming the nodes") {
  auto cluster = write_cluster("replica-explicit", 3,
                               "placement { policy: \"explicit\" assign { node: \"n0\" ops: \"wte\" ops: \"wpe\" "
                               "ops: \"h0.*\" } assign { node: \"n1\" replica: \"n2\" ops: \"h1.*\" ops: \"lnf\" "
                               "ops: \"lm_head\" ops: \"loss\" } }");
  std::vector<child_process> nodes;
  const std::string error = run_error(tiny_config(3, 2), cluster, 3, "replica-explicit", nodes);
  INFO(error);
  INFO(all_output(nodes));
  CHECK(error.find("the replica entries of " + cluster + " make stage replicas") != std::string::npos);
  CHECK(error.find("on nodes n1, n2") != std::string::npos);
  CHECK(error.find("`fusion-cluster plan` predicts but this runtime does not execute yet") != std::string::npos);
  CHECK(error.find("cluster.policy=opfence") != std::string::npos);
  for (auto& n : nodes) CHECK(n.wait(15) >= 0);  // told to stop, not left waiting for ops
}

TEST_CASE("cluster: policy opfence-replicas is refused when it plans replicas, and opfence is not") {
  // Three slow nodes on one site with stated rates, given as the profile (no measuring at join):
  // OP-Fence with replicas holds the model's one heavy stage three times over.
  const std::string text =
      "name: \"replica-policy\"\ncoordinator { host: \"127.0.0.1\" port: 0 }\nsite { name: \"s\" }\n"
      "node { name: \"n0\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n"
      "node { name: \"n1\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n"
      "node { name: \"n2\" site: \"s\" device: \"cpu\" gflops: 0.01 memory_gib: 4 }\n";
  const auto cluster = temp_path("replica-policy.pbtxt");
  std::ofstream(cluster) << text;
  const auto profile = temp_path("replica-policy.profile");
  save_profile(profile, profile_from_cluster(load_cluster(cluster)));

  auto c = tiny_config(2, 4);
  c.profile_file = profile;
  c.policy = "opfence-replicas";
  std::vector<child_process> nodes;
  const std::string error = run_error(c, cluster, 3, "replica-policy", nodes);
  INFO(error);
  INFO(all_output(nodes));
  CHECK(error.find("cluster.policy opfence-replicas planned stage replicas (") != std::string::npos);
  CHECK(error.find("on nodes n") != std::string::npos);
  CHECK(error.find("this runtime does not execute yet; use cluster.policy=opfence") != std::string::npos);
  for (auto& n : nodes) CHECK(n.wait(15) >= 0);

  // The default, pipeline-only, trains on the same cluster and profile.
  c.policy = "opfence";
  std::vector<child_process> again;
  CHECK(run_error(c, cluster, 3, "replica-policy-pipeline", again) == "");
  for (auto& n : again) CHECK(n.wait(15) == 0);
}
