// fusion-bench-microbatch: how well train.micro-batches = auto's GEMM-efficiency model
// (scheduler/micro_batches.hpp) moves op times between micro-batch shapes. For every divisor M of
// the batch it times every op of the model at B/M rows on this device (time_ops, as a node does
// at join) and predicts the same from the times measured at the reference M (the middle divisor)
// with the model at several half_rows h (0: times linear in rows). Compared per step: the sum over
// ops of (forward + backward) x M, which is what the estimator feeds its simulation.
//
//   fusion-bench-microbatch [--model FILE] [--batch B] [--device cpu|cuda:N]
//
// Output: a table of measured and predicted compute per step for each M and h, then the mean
// absolute error of each h, and the M each would rank fastest against the measured one.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/graph.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/op_timing.hpp"

using namespace fusion;

namespace {

// Forward + backward seconds of one step of M micro-batches: every op of `g` once per
// micro-batch, with the time `times` gives its key.
double step_compute(const graph& g, const std::map<std::string, op_timing>& times, int64_t m) {
  double s = 0;
  for (size_t id = 0; id < g.nodes.size(); ++id) {
    if (g.nodes[id].is_input()) continue;
    const auto it = times.find(op_key(g, static_cast<int>(id)));
    if (it != times.end()) s += (it->second.forward_s + it->second.backward_s) * static_cast<double>(m);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "configs/models/gpt-char-small.pbtxt", device = "cpu";
  int64_t batch = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--batch") batch = std::atoll(argv[i + 1]);
    else if (a == "--device") device = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: fusion-bench-microbatch [--model FILE] [--batch B] [--device cpu|cuda:N]\n");
      return 2;
    }
  }
  const std::vector<int64_t> ms = micro_batch_candidates(batch, 64);
  const int64_t ref = ms[ms.size() / 2];
  const std::vector<double> halves = {0, 2, 8, 32, 128, 512};
  std::map<int64_t, graph> graphs;
  std::map<int64_t, std::map<std::string, op_timing>> measured;
  for (const int64_t m : ms) {
    graphs.emplace(m, load_graph(model, batch / m));
    measured[m] = time_ops(device, op_signatures(graphs.at(m))).ops;
  }
  std::printf("fusion-bench-microbatch: %s, batch %lld on %s; op times measured at every M, predicted from M=%lld\n",
              model.c_str(), static_cast<long long>(batch), device.c_str(), static_cast<long long>(ref));
  std::printf("compute per step (forward + backward of every op, all micro-batches), seconds\n%6s %10s", "M",
              "measured");
  for (const double h : halves) std::printf("   h=%-6g", h);
  std::printf("\n");
  std::map<double, double> err_sum;
  std::map<double, std::pair<int64_t, double>> fastest;  // by h: predicted fastest M
  std::pair<int64_t, double> fastest_measured{0, 1e300};
  for (const int64_t m : ms) {
    const double got = step_compute(graphs.at(m), measured[m], m);
    if (got < fastest_measured.second) fastest_measured = {m, got};
    std::printf("%6lld %10.4f", static_cast<long long>(m), got);
    for (const double h : halves) {
      cluster_profile p;
      p.nodes.resize(1);
      p.nodes[0].device = device;
      p.nodes[0].ops = measured[ref];
      micro_batch_options o;
      o.cpu_half_rows = o.gpu_half_rows = h;
      const cluster_profile moved = rescale_profile(p, graphs.at(ref), graphs.at(m), static_cast<int>(m), o);
      const double want = step_compute(graphs.at(m), moved.nodes[0].ops, m);
      err_sum[h] += std::abs(want - got) / got;
      auto& f = fastest[h];
      if (f.first == 0 || want < f.second) f = {m, want};
      std::printf(" %10.4f", want);
    }
    std::printf("\n");
  }
  std::printf("%17s", "mean |error|");
  for (const double h : halves) std::printf(" %9.1f%%", 100 * err_sum[h] / static_cast<double>(ms.size()));
  std::printf("\n%17s", "fastest M");
  for (const double h : halves) std::printf(" %10lld", static_cast<long long>(fastest[h].first));
  std::printf("\nmeasured fastest M: %lld\n", static_cast<long long>(fastest_measured.first));
  return 0;
}
