// fusion-bench-flops: training FLOPs per token of a model file, summed from every node's
// op::cost() (the same numbers the workload estimator uses), with a per-op-kind breakdown.
//
//   fusion-bench-flops [--batch 16] MODEL.pbtxt
//
// Shape legend: B batch rows the graph is loaded with, T context, C channels, L layers.
// FLOPs per token = sum over nodes of (flops_forward + flops_backward) / (B * T). A multiply-add
// counts 2; the optimizer step, data loading and message passing are not counted (the usual
// convention, so the rate compares with "6N + attention" estimates and with sgemm GFLOP/s).
//
// Last line, machine-readable:
//     RESULT flops_per_token=... fwd_flops_per_token=... bwd_flops_per_token=... params=... batch=... context=...
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/graph.hpp"

namespace {

struct kind_total {
  int nodes = 0;
  double fwd = 0, bwd = 0;
};

int run(int argc, char** argv) {
  int64_t batch = 16;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::puts("usage: fusion-bench-flops [--batch 16] MODEL.pbtxt");
      return 0;
    } else if (a == "--batch" || a.rfind("--batch=", 0) == 0) {
      std::string v = a.size() > 7 ? a.substr(8) : (i + 1 < argc ? argv[++i] : "");
      char* end = nullptr;
      batch = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || batch < 1) {
        std::fprintf(stderr, "fusion-bench-flops: --batch: want a positive integer, got '%s'\n", v.c_str());
        return 2;
      }
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "fusion-bench-flops: unknown option '%s' (try --help)\n", a.c_str());
      return 2;
    } else if (path.empty()) {
      path = a;
    } else {
      std::fprintf(stderr, "fusion-bench-flops: more than one model file given ('%s', '%s')\n", path.c_str(),
                   a.c_str());
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "fusion-bench-flops: no model file (usage: fusion-bench-flops [--batch 16] MODEL.pbtxt)\n");
    return 2;
  }

  const fusion::graph g = fusion::load_graph(path, batch);
  std::map<std::string, kind_total> kinds;
  double fwd = 0, bwd = 0;
  for (const auto& n : g.nodes) {
    if (n.is_input() || !n.impl) continue;
    std::vector<fusion::shape_t> shapes;
    for (int in : n.inputs) shapes.push_back(g.nodes.at(in).shape);
    const fusion::op_cost c = n.impl->cost(shapes);
    auto& k = kinds[n.kind];
    ++k.nodes;
    k.fwd += c.flops_forward;
    k.bwd += c.flops_backward;
    fwd += c.flops_forward;
    bwd += c.flops_backward;
  }
  const double tokens = static_cast<double>(g.batch * g.context);
  if (tokens <= 0) {
    std::fprintf(stderr, "fusion-bench-flops: %s: batch %lld x context %lld gives no tokens\n", path.c_str(),
                 static_cast<long long>(g.batch), static_cast<long long>(g.context));
    return 1;
  }
  const auto params = g.param_count();

  std::printf("model %s (%s): %lld parameters, batch %lld x context %lld = %.0f tokens\n\n", g.name.c_str(),
              path.c_str(), static_cast<long long>(params), static_cast<long long>(g.batch),
              static_cast<long long>(g.context), tokens);
  std::printf("%-20s %6s %14s %14s %14s %7s\n", "op kind", "nodes", "fwd FLOP/tok", "bwd FLOP/tok", "total FLOP/tok",
              "share");
  for (const auto& [name, k] : kinds)
    std::printf("%-20s %6d %14.4g %14.4g %14.4g %6.1f%%\n", name.c_str(), k.nodes, k.fwd / tokens, k.bwd / tokens,
                (k.fwd + k.bwd) / tokens, 100.0 * (k.fwd + k.bwd) / (fwd + bwd));
  std::printf("%-20s %6s %14.4g %14.4g %14.4g %6.1f%%\n", "total", "", fwd / tokens, bwd / tokens,
              (fwd + bwd) / tokens, 100.0);
  // The textbook estimate for comparison: 6 FLOPs per parameter per token (fwd 2, bwd 4).
  std::printf("\nfor comparison 6 * params = %.4g FLOP/token (ignores attention scores, counts embedding lookups)\n",
              6.0 * static_cast<double>(params));
  std::printf("\nRESULT flops_per_token=%.6g fwd_flops_per_token=%.6g bwd_flops_per_token=%.6g params=%lld batch=%lld "
              "context=%lld\n",
              (fwd + bwd) / tokens, fwd / tokens, bwd / tokens, static_cast<long long>(params),
              static_cast<long long>(g.batch), static_cast<long long>(g.context));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-flops: %s\n", e.what());
    return 1;
  }
}
