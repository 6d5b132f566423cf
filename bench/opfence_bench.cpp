// fusion-bench-opfence: how long OP-Fence takes to plan at the paper's scale.
//
// Planning runs once at join and again whenever the scheduler re-plans, so it must stay well
// under a step. Timed here (processor time of this process, best and median of --reps runs):
//   cut DP     scheduler/opfence_cut.cpp alone on random problems of 485 and 800 ops over 48
//              positions (no skip), and 800 ops over 16 positions with skip
//   paper-48-a/b/c  opfence_place for gpt2-xl on the three 48-GPU topologies of
//              configs/clusters/paper-48-*.pbtxt (the ones `fusion-cluster plan` predicts)
//   fences-12  opfence_place for gpt2-xl on 48 single-node sites in 12 groups of 4
//   ... replicas  the same with stage replicas (policy opfence): the pipeline-only plan, then the
//              chains of replica groups (scheduler/opfence_replicas.cpp)
//   sites-*    opfence_place with replicas for gpt-char-small at 64 rows in 16 micro-batches on
//              the emulated topologies (configs/clusters/sites-*.pbtxt): CPU nodes under quotas,
//              whose every plan the estimator simulates at several quota phases
// The targets (the bounds the unit tests once checked): the cut DP under 0.5 s, each whole plan
// under 2 s (6 s with replicas). The exit status is 1 when a median misses its target.
//
// --compressed-dp prints, instead, what the compression-aware DP (opfence_options::
// cut_bytes_ratio) gains: the predicted step of gpt-char-small (batch 16, 4 micro-batches) on
// every shipped sites-* topology, per codec and with and without replicas, planned with the
// codecs simulated only against that plus the compressed cuts (predictions, no timing).
//
//   fusion-bench-opfence [--reps N] [--compressed-dp]   (from the repository root, or FUSION_SOURCE_DIR)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/profile.hpp"

using namespace fusion;

namespace {

// Processor time, not wall time: a busy neighbour stretches wall time but not the planner's work.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct timing {
  double best = 1e30, median = 0;
};

timing time_reps(int reps, const std::function<void()>& fn) {
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_seconds();
    fn();
    s.push_back(cpu_seconds() - t0);
  }
  std::sort(s.begin(), s.end());
  return {s.front(), s[s.size() / 2]};
}

cut_problem big_problem(int k_count, int n, bool skip) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.5, 1.5);
  cut_problem p;
  p.compute_s.assign(k_count, std::vector<double>(n, 0.0));
  p.cross_bytes.assign(n, 0.0);
  p.seconds_per_byte.assign(k_count, std::vector<double>(k_count, 0.0));
  p.latency_s.assign(k_count, std::vector<double>(k_count, 0.0));
  p.memory_bytes.assign(n, 0.0);
  p.capacity_bytes.assign(k_count, 1e8 * n / k_count * 2);
  p.allow_skip = skip;
  for (int i = 0; i < n; ++i) {
    const double base = unit(rng);
    for (int k = 0; k < k_count; ++k) p.compute_s[k][i] = base * (1 + k % 3);
    p.cross_bytes[i] = 1e6 * unit(rng);
    p.memory_bytes[i] = 1e8 * unit(rng);
  }
  for (int a = 0; a < k_count; ++a)
    for (int b = a + 1; b < k_count; ++b) {
      p.seconds_per_byte[a][b] = 8e-9 * (1 + (a / 16 != b / 16) * 100);
      p.latency_s[a][b] = 1e-3;
    }
  return p;
}

std::string link(const std::string& a, const std::string& b, double mbit) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "link { a: \"%s\" b: \"%s\" mbit: %g }\n", a.c_str(), b.c_str(), mbit);
  return buf;
}

// 48 single-node sites in 12 groups of 4: 1000 Mbit/s inside a group, 100 / distance between.
cluster_spec fences_12() {
  std::string text = "name: \"fences-12\"\n", nodes, links;
  for (int i = 0; i < 48; ++i) {
    const std::string s = "s" + std::to_string(i);
    text += "site { name: \"" + s + "\" }\n";
    nodes += "node { name: \"" + s + "n\" site: \"" + s + "\" device: \"cuda:0\" gflops: 10000 memory_gib: 40 }\n";
    for (int j = i + 1; j < 48; ++j)
      links += link(s, "s" + std::to_string(j), i / 4 == j / 4 ? 1000 : 100.0 / std::abs(i / 4 - j / 4));
  }
  return parse_cluster(text + nodes + links, "fences-12.pbtxt");
}

// The compression-aware DP's table (--compressed-dp): predictions only.
int compressed_dp_table(const std::string& root) {
  const graph g = load_graph(root + "/configs/models/gpt-char-small.pbtxt", 16);
  std::printf("fusion-bench-opfence --compressed-dp: gpt-char-small, batch 16 in 4 micro-batches, rates as the "
              "cluster files state them; predicted step seconds\n\n");
  std::printf("| topology | codec | replicas | codecs simulated only | + compressed cuts | gain |\n"
              "|---|---|---|---:|---:|---:|\n");
  for (const char* name : {"sites-2-slow", "sites-3", "sites-4-pairs", "sites-6-tiers", "sites-2x3"}) {
    const cluster_spec c = load_cluster(root + "/configs/clusters/" + name + ".pbtxt");
    cluster_profile prof = profile_from_cluster(c);
    prof.micro_batches = 4;
    const workload_estimator est(g, c, prof);
    for (codec_kind mode : {codec_kind::int8, codec_kind::int4, codec_kind::adatopk}) {
      compression_config cc;
      cc.mode = mode;
      for (bool replicas : {false, true}) {
        opfence_options o;
        o.replicas = replicas;
        o.prepare_plan = [&](plan& p) { assign_codecs(p, &est, cc); };
        opfence_report before, after;
        opfence_place(est, o, &before);
        o.cut_bytes_ratio = cut_bytes_ratio(cc);
        opfence_place(est, o, &after);
        std::printf("| %s | %s | %s | %.3f | %.3f | %.3fx |\n", name, to_string(mode).c_str(), replicas ? "yes" : "no",
                    before.estimate.step_s, after.estimate.step_s, before.estimate.step_s / after.estimate.step_s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool compressed_dp = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--compressed-dp") {
      compressed_dp = true;
    } else {
      std::fprintf(stderr, "usage: fusion-bench-opfence [--reps N] [--compressed-dp]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const char* root = std::getenv("FUSION_SOURCE_DIR");
  if (compressed_dp) {
    try {
      return compressed_dp_table(root ? root : ".");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fusion-bench-opfence: %s (run from the repository root or set FUSION_SOURCE_DIR)\n", e.what());
      return 2;
    }
  }
  const std::string model = std::string(root ? root : ".") + "/configs/models/gpt2-xl.pbtxt";
  graph g;
  try {
    g = load_graph(model, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-opfence: %s (run from the repository root or set FUSION_SOURCE_DIR)\n",
                 e.what());
    return 2;
  }
  std::printf("fusion-bench-opfence: processor seconds, %d repetitions each\n\n", reps);
  std::printf("| problem | size | best s | median s | target s | candidates |\n|---|---|---:|---:|---:|---:|\n");
  bool missed = false;
  auto row = [&](const char* what, const std::string& size, timing t, double target, size_t candidates) {
    std::printf("| %s | %s | %.3f | %.3f | %.1f | %s |\n", what, size.c_str(), t.best, t.median, target,
                candidates ? std::to_string(candidates).c_str() : "-");
    std::fflush(stdout);
    missed = missed || t.median >= target;
  };
  struct dp_case {
    int k, n;
    bool skip;
  };
  for (auto c : {dp_case{48, 485, false}, dp_case{48, 800, false}, dp_case{16, 800, true}}) {
    const cut_problem p = big_problem(c.k, c.n, c.skip);
    bool feasible = true;
    auto t = time_reps(reps, [&] { feasible = solve_cuts(p).feasible; });
    if (!feasible) std::fprintf(stderr, "fusion-bench-opfence: a cut problem had no feasible plan\n");
    row("cut DP", std::to_string(c.n) + " ops, " + std::to_string(c.k) + " positions" + (c.skip ? ", skip" : ""), t,
        0.5, 0);
  }
  struct plan_case {
    std::string name;
    cluster_spec cluster;
  };
  std::vector<plan_case> plans;
  try {
    for (const char* t : {"a", "b", "c"})
      plans.push_back({std::string("paper-48-") + t,
                       load_cluster(std::string(root ? root : ".") + "/configs/clusters/paper-48-" + t + ".pbtxt")});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-opfence: %s\n", e.what());
    return 2;
  }
  plans.push_back({"fences-12", fences_12()});
  for (auto& c : plans) {
    cluster_profile prof = profile_from_cluster(c.cluster);
    prof.micro_batches = 8;
    workload_estimator est(g, c.cluster, prof);
    opfence_report report;
    auto t = time_reps(reps, [&] { opfence_place(est, {}, &report); });
    row(c.name.c_str(), "gpt2-xl (" + std::to_string(g.nodes.size()) + " ops), 48 nodes", t, 2.0, report.candidates);
    // Policy opfence: the pipeline-only plan, then the chains of replica groups.
    opfence_options with_replicas;
    with_replicas.replicas = true;
    auto r = time_reps(reps, [&] { opfence_place(est, with_replicas, &report); });
    row((c.name + " replicas").c_str(), "gpt2-xl (" + std::to_string(g.nodes.size()) + " ops), 48 nodes", r, 6.0,
        report.candidates + report.replica_candidates);
  }
  // The emulated sites: small models, but capped nodes (every plan simulated per quota phase).
  try {
    const graph small = load_graph(std::string(root ? root : ".") + "/configs/models/gpt-char-small.pbtxt", 64);
    for (const char* name : {"sites-2-slow", "sites-3", "sites-4-pairs", "sites-6-tiers", "sites-2x3"}) {
      const cluster_spec c = load_cluster(std::string(root ? root : ".") + "/configs/clusters/" + name + ".pbtxt");
      cluster_profile prof = profile_from_cluster(c);
      prof.micro_batches = 16;
      const workload_estimator est(small, c, prof);
      opfence_options with_replicas;
      with_replicas.replicas = true;
      opfence_report report;
      auto t = time_reps(reps, [&] { opfence_place(est, with_replicas, &report); });
      row((std::string(name) + " replicas").c_str(),
          "gpt-char-small (" + std::to_string(small.nodes.size()) + " ops), " + std::to_string(c.nodes.size()) +
              " capped nodes, 16 micro-batches",
          t, 2.0, report.candidates + report.replica_candidates);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-opfence: %s\n", e.what());
    return 2;
  }
  if (missed) std::printf("\na median missed its target\n");
  return missed ? 1 : 0;
}
