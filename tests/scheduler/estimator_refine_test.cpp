// Workload-estimator refinement: measured op times and tensor transfers move the profile's op
// times, each node's correction for the ops it never ran, and the link rates; a node admitted
// mid-run starts over from its new profile. The simulated step itself: estimator_test.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "core/graph_loader.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "tests/scheduler/chain_model.hpp"

namespace fusion {
namespace {

// Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5.
const std::string chain_model = chain_model_text(16, 4, 8);

TEST_CASE("scheduler/estimator: measurements refine op times and links") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites();
  cluster_profile prof = timed_profile(g, c, 2, 100, chain_times);
  prof.links[0].rtt_s = 0.01;
  workload_estimator est(g, c, prof);
  const int wte = 2, fc = 3, lm_head = 4;
  const double w = est.options().ema_weight;
  CHECK(est.forward_s(fc, 0) == doctest::Approx(1));

  // The first measurement replaces the profile; fc took 6 s where 3 were profiled.
  est.observe_op(fc, 0, 2.0, 4.0);
  CHECK(est.forward_s(fc, 0) == doctest::Approx(2.0));
  CHECK(est.backward_s(fc, 0) == doctest::Approx(4.0));
  const double corr = 1 + w * (2.0 - 1);
  CHECK(est.forward_s(wte, 0) == doctest::Approx(1 * corr));  // unmeasured, same node: follows
  CHECK(est.backward_s(wte, 0) == doctest::Approx(1 * corr));
  // Another node that ran nothing yet: what the measured nodes showed about their profiles.
  CHECK(est.forward_s(fc, 1) == doctest::Approx(1 * corr));
  CHECK(est.forward_s(lm_head, 1) == doctest::Approx(2 * corr));
  // Once measured, a node has its own correction.
  const workload_estimator profiled(g, c, prof);
  est.observe_op(lm_head, 1, profiled.forward_s(lm_head, 1), profiled.backward_s(lm_head, 1));  // as profiled
  CHECK(est.forward_s(fc, 1) == doctest::Approx(1));
  CHECK(est.update_s(fc, 0) == doctest::Approx(0.5));         // updates are not scaled

  // Later measurements move the average toward themselves.
  est.observe_op(fc, 0, 1.0, 2.0);
  CHECK(est.forward_s(fc, 0) == doctest::Approx(2.0 + w * (1.0 - 2.0)));
  CHECK(est.forward_s(fc, 0) < 2.0);
  CHECK(est.forward_s(fc, 0) > 1.0);
  CHECK(est.forward_s(wte, 0) == doctest::Approx(corr + w * (1.0 - corr)));

  // Links: the cluster's 100 Mbit/s with the profile's 10 ms round trip.
  CHECK(est.link_mbit(0, 1) == doctest::Approx(100));
  CHECK(est.link_rtt_s(1, 0) == doctest::Approx(0.01));
  CHECK(est.transfer_s(1e6, 0, 1) == doctest::Approx(0.08 + 0.005));
  CHECK(std::isinf(est.link_mbit(1, 1)));
  CHECK(est.transfer_s(1e6, 1, 1) == 0);
  // 1 MB timed from its first chunk in 0.17 s less the round trip: 8 Mbit in 0.16 s = 50 Mbit/s,
  // both directions.
  est.observe_transfer(0, 1, 1e6, 0.17, 1);
  CHECK(est.link_mbit(0, 1) == doctest::Approx(50));
  CHECK(est.link_mbit(1, 0) == doctest::Approx(50));
  CHECK(est.link_rtt_s(0, 1) == doctest::Approx(0.01));
  est.observe_transfer(1, 0, 1e6, 0.08, 0);  // queued behind another: 100 Mbit/s
  CHECK(est.link_mbit(0, 1) == doctest::Approx(50 + w * 50));
  est.observe_transfer(0, 1, 0, 1.0, 1);     // ignored: nothing sent
  est.observe_transfer(0, 1, 1e6, 0, 1);     // ignored: no time
  CHECK(est.link_mbit(0, 1) == doctest::Approx(50 + w * 50));
}

TEST_CASE("scheduler/estimator: a step's ops move their node's correction once, by their time-weighted ratio") {
  // A node stopped nine tenths of the time in short periods: its long op (lm_head, 4 s profiled)
  // takes ten times its profile, its short ones (wte, fc: 2 and 3 s) fit between two stops and
  // run as profiled. Whatever order the step's ops come in, an op never measured there (loss)
  // must follow the node's time-weighted slowdown, (40 + 2 + 3) / (4 + 2 + 3) = 5.
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites();
  const int wte = 2, fc = 3, lm_head = 4, loss = 5;
  const double w = workload_estimator(g, c, timed_profile(g, c, 2, 100, chain_times)).options().ema_weight;
  using sample = workload_estimator::op_sample;
  const std::vector<sample> long_first = {{lm_head, 20, 20}, {wte, 1, 1}, {fc, 1, 2}};
  const std::vector<sample> long_last = {{wte, 1, 1}, {fc, 1, 2}, {lm_head, 20, 20}};
  for (const auto* order : {&long_first, &long_last}) {
    workload_estimator est(g, c, timed_profile(g, c, 2, 100, chain_times));
    est.observe_ops(0, *order);
    const double corr = 1 + w * (5.0 - 1);
    CHECK(est.forward_s(loss, 0) == doctest::Approx(1 * corr));
    CHECK(est.forward_s(lm_head, 0) == doctest::Approx(20));  // measured: its own average
    CHECK(est.forward_s(wte, 1) == doctest::Approx(1 * corr));  // b0 ran nothing: a0's factor
    // A second step moves the factor once more, not once per op.
    est.observe_ops(0, *order);
    CHECK(est.forward_s(loss, 0) == doctest::Approx(corr + w * (5.0 - corr)));
  }
  // Steps of the same measurements settle the factor at 5. One op at a time it would settle where
  // the order puts it: about 3 with the short ops last.
  workload_estimator per_step(g, c, timed_profile(g, c, 2, 100, chain_times));
  workload_estimator one_by_one(g, c, timed_profile(g, c, 2, 100, chain_times));
  for (int step = 0; step < 40; ++step) {
    per_step.observe_ops(0, long_first);
    for (auto& o : long_first) one_by_one.observe_op(o.id, 0, o.forward_s, o.backward_s);
  }
  CHECK(per_step.forward_s(loss, 0) == doctest::Approx(5));
  CHECK(one_by_one.forward_s(loss, 0) < 3.5);
  // A bad op id is refused before anything is learned.
  workload_estimator est(g, c, timed_profile(g, c, 2, 100, chain_times));
  CHECK_THROWS_AS(est.observe_ops(0, {{fc, 5, 5}, {99, 1, 1}}), std::out_of_range);
  CHECK(est.forward_s(fc, 0) == doctest::Approx(1));
}

TEST_CASE("scheduler/estimator: a link with a long round trip is learned at its rate from tensors timed as edge senders time them") {
  // 100 Mbit/s with a 50 ms round trip, profiled at 300. An edge sender times a tensor that found
  // the edge idle from its first chunk to its last acknowledgement (serialisation plus the round
  // trip) and one queued behind it from that one's acknowledgement (serialisation alone); the
  // coordinator hands the estimator the means over a step's tensors of one edge.
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites();
  cluster_profile prof = timed_profile(g, c, 2, 300, chain_times);
  prof.links[0].rtt_s = 0.05;
  const double bytes = 512 * 1024, serial = bytes * 8 / 100e6;
  for (int burst : {1, 4, 16}) {
    INFO(burst << " tensors sent back to back");
    workload_estimator est(g, c, prof);
    est.observe_transfer(0, 1, bytes, (burst * serial + 0.05) / burst, 1.0 / burst);
    CHECK(est.link_mbit(0, 1) == doctest::Approx(100));
  }
  // Half a round trip off every tensor (the rule before) learned 63 Mbit/s from the lone tensor,
  // 142 and 209 from the bursts.
  // The simulation then charges the link serialisation per tensor, plus half the round trip to
  // the receiver once.
  workload_estimator est(g, c, prof);
  est.observe_transfer(0, 1, bytes, serial + 0.05, 1);
  CHECK(est.transfer_s(bytes, 0, 1) == doctest::Approx(serial + 0.025));
}

TEST_CASE("scheduler/estimator: a node admitted mid-run takes its new profile and forgets what it measured before") {
  graph g = parse_graph(chain_model, "chain.pbtxt", 1);
  cluster_spec c = estimator_sites(true);  // a0, b0, and a1 and c0, which run nothing
  cluster_profile prof = timed_profile(g, c, 2, 100, chain_times);
  workload_estimator est(g, c, prof);
  const int fc = 3, lm_head = 4, a1 = 2;
  est.observe_op(fc, 0, 2.0, 4.0);
  est.observe_op(fc, 1, 3.0, 3.0);
  est.observe_transfer(0, 1, 1e6, 0.16, 0);  // 50 Mbit/s
  CHECK(est.link_mbit(0, 1) == doctest::Approx(50).epsilon(0.01));
  // b0 comes back (another process, maybe another machine): twice as fast, its link probed at 400.
  node_profile back = prof.nodes[1];
  for (auto& [key, t] : back.ops) t = {t.forward_s / 2, t.backward_s / 2, t.update_s / 2};
  link_profile probed;
  probed.site_a = 0;
  probed.site_b = 1;
  probed.mbit = 400;
  probed.rtt_s = 0.002;
  probed.measured = true;
  est.admit_node(1, back, {probed});
  // Its new profile as it is, not the 3 s measured before: timed while the run shared the
  // machines, it already holds what a0's correction (fc at twice its profile) says of them.
  CHECK(est.forward_s(fc, 1) == doctest::Approx(0.5));
  CHECK(est.backward_s(lm_head, 1) == doctest::Approx(1.0));
  // a1, profiled before the run and idle since, takes the measured nodes' mean correction (a0's;
  // b0 has measured nothing since it came back).
  const double corr = 1 + est.options().ema_weight * (2.0 - 1);
  CHECK(est.forward_s(fc, a1) == doctest::Approx(1.0 * corr));
  // Once it runs ops, the admitted node is corrected by what it measures.
  est.observe_op(fc, 1, 1.5, 3.0);
  CHECK(est.forward_s(lm_head, 1) == doctest::Approx(1.0 * (1 + est.options().ema_weight * (3.0 - 1))));
  CHECK(est.forward_s(fc, 0) == doctest::Approx(2.0));       // the other node keeps its measurements
  CHECK(est.link_mbit(0, 1) == doctest::Approx(400));         // the refined 50 is forgotten
  CHECK(est.link_rtt_s(1, 0) == doctest::Approx(0.002));
  CHECK(est.profile().nodes[1].ops == back.ops);
  REQUIRE(est.profile().links.size() == 1);
  CHECK(est.profile().links[0].mbit == 400);
  CHECK_THROWS_AS(est.admit_node(4, back, {}), std::out_of_range);
}

}  // namespace
}  // namespace fusion
