// train.micro-batches = auto end to end: a run on node processes and a one-process run each pick
// a divisor of the batch (from the profile the nodes measured, or from the op times the process
// measured), and then really train with it: every step feeds that many micro-batches through
// every op, and the losses are those of a run given that count.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "actors/trainer.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using fusion::test::child_process;
using fusion::test::losses_of;
using namespace fusion::test::cluster;

namespace {

struct auto_run {
  int64_t micro_batches = 0;
  train_result result;
};

auto_run run(train_config c, int nodes, const std::string& tag) {
  std::vector<child_process> children;
  if (nodes > 0) on_nodes(c, write_cluster(tag, nodes, "placement { policy: \"even\" }"), nodes, children, tag);
  auto_run out;
  {
    session s(c);
    out.micro_batches = s.micro_batches();
    out.result = s.train();
  }
  for (auto& n : children) CHECK(n.wait(15) == 0);
  return out;
}

// Every step ran `m` micro-batches through every op.
void check_trained_with(const auto_run& r, int64_t m) {
  REQUIRE_FALSE(r.result.steps.empty());
  for (const auto& step : r.result.steps)
    for (const auto& op : step.ops) {
      CAPTURE(op.node);
      CHECK(static_cast<int64_t>(op.forward_s.size()) == m);
    }
}

}  // namespace

TEST_CASE("micro-batches auto: on 2 node processes the coordinator picks a divisor and trains with it") {
  auto c = tiny_config(4, 1);
  c.micro_batches_auto = true;
  c.micro_batches = 2;  // the reference count the nodes profile at (fusion-train: the middle divisor)
  const auto_run got = run(c, 2, "mb-auto2");
  CAPTURE(got.micro_batches);
  CHECK(got.micro_batches >= 1);
  CHECK(c.batch % got.micro_batches == 0);
  check_trained_with(got, got.micro_batches);
  // The same losses as a run told that count (the same kernels in the same order).
  auto fixed = tiny_config(4, got.micro_batches);
  const auto_run want = run(fixed, 2, "mb-fixed2");
  const auto a = losses_of(got.result), b = losses_of(want.result);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(b[i]));
}

TEST_CASE("micro-batches auto: one process times its ops, picks a divisor and trains with it") {
  auto c = tiny_config(2, 1);
  c.micro_batches_auto = true;
  c.micro_batches = 2;
  const auto_run got = run(c, 0, "mb-auto-local");
  CHECK(c.batch % got.micro_batches == 0);
  check_trained_with(got, got.micro_batches);
}
