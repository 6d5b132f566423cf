// fusion-bench-sgemm: OpenBLAS sgemm GFLOP/s on the GEMM shapes that dominate gpt-char-small
// training, at several BLAS thread counts. bench/train_bench.sh uses its peak rate as the
// reference our achieved training FLOP/s is compared against (both measured in the same run).
//
//   fusion-bench-sgemm [--rows 2048,512] [--threads 1,2] [--min-time 0.3] [--C 256] [--V 64]
//                      [--layers 6]
//
// Shape legend: M rows (B*T tokens: 16*128 = 2048 for the whole batch, 512 for one of 4
// micro-batches), C channels, V vocabulary; a linear layer maps K input to N output features.
// Each linear layer of the model costs three GEMMs, exactly as ops/cpu/linear.cpp issues them:
//     fwd  y = x W^T      gemm(NT) M x N x K
//     dx   dx += dy W     gemm(NN) M x K x N
//     dW   dW += dy^T x   gemm(TN) N x K x M
// A multiply-add counts as 2 FLOPs, so one GEMM is 2*M*N*K FLOPs.
//
// Output: a table (median rate of repeated calls per shape), the "mix" rate (all linear GEMMs
// of one fwd+bwd pass of the model, total FLOPs / total time) per rows and threads, and one
// final machine-readable line:
//     RESULT peak_gflops=... peak_threads=... peak_shape=... mix_gflops_t1=... mix_gflops_t2=...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cpu/blas.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::vector<int> rows{2048, 512};
  std::vector<int> threads{1, 2};
  double min_time = 0.3;  // seconds of timed calls per (shape, threads)
  int C = 256, V = 64, layers = 6;
};

/// One linear layer of the model: K -> N features, `count` of them per forward pass.
struct linear_shape {
  const char* name;
  int K, N, count;
};

/// One GEMM call: C[m,n] (+)= op(A)[m,k] op(B)[k,n].
struct gemm_shape {
  std::string label;
  bool ta, tb;
  int m, n, k;
  float beta;
  double flops() const { return 2.0 * m * n * k; }
};

std::vector<int> parse_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1 << 20)
      throw std::invalid_argument(std::string(what) + ": bad value '" + item + "' (want positive integers, comma-separated)");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw std::invalid_argument(std::string(what) + ": empty list");
  return out;
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], value;
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a != "-h" && a != "--help") {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      value = argv[++i];
    }
    if (a == "-h" || a == "--help") {
      std::puts("usage: fusion-bench-sgemm [--rows 2048,512] [--threads 1,2] [--min-time 0.3] [--C 256] "
                "[--V 64] [--layers 6]");
      std::exit(0);
    } else if (a == "--rows") {
      o.rows = parse_list(value, "--rows");
    } else if (a == "--threads") {
      o.threads = parse_list(value, "--threads");
    } else if (a == "--min-time") {
      o.min_time = std::atof(value.c_str());
      if (!(o.min_time > 0)) throw std::invalid_argument("--min-time: want seconds > 0, got '" + value + "'");
    } else if (a == "--C") {
      o.C = parse_list(value, "--C").at(0);
    } else if (a == "--V") {
      o.V = parse_list(value, "--V").at(0);
    } else if (a == "--layers") {
      o.layers = parse_list(value, "--layers").at(0);
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (try --help)");
    }
  }
  return o;
}

/// Median seconds per call of `g`, calling it until `min_time` seconds have passed (at least 5
/// calls, after 2 untimed ones that fault in pages and spin up the BLAS thread pool).
double time_gemm(const gemm_shape& g, float* a, float* b, float* c, double min_time) {
  const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  auto call = [&] { fusion::cpu::gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a, lda, b, ldb, g.beta, c, g.n); };
  call();
  call();
  std::vector<double> samples;
  auto start = clock_type::now();
  while (samples.size() < 5 || std::chrono::duration<double>(clock_type::now() - start).count() < min_time) {
    auto t0 = clock_type::now();
    call();
    samples.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

int run(int argc, char** argv) {
  const options o = parse_args(argc, argv);
  const int C = o.C;
  // Per forward pass: qkv, attention output projection, MLP up and down (each once per layer),
  // and the untied vocabulary head once.
  const std::vector<linear_shape> linears = {{"qkv", C, 3 * C, o.layers},
                                             {"proj", C, C, o.layers},
                                             {"fc", C, 4 * C, o.layers},
                                             {"fc_proj", 4 * C, C, o.layers},
                                             {"head", C, o.V, 1}};

  const int max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  // Every operand is at most (larger of M, 4C, V) x (larger of 4C, V).
  const size_t wide = static_cast<size_t>(std::max(4 * C, o.V));
  const size_t max_elems = std::max<size_t>(max_rows, wide) * wide;
  std::vector<float> a(max_elems), b(max_elems), c(max_elems);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = u(rng);

  std::printf("OpenBLAS sgemm, gpt-char-small GEMM shapes (C=%d, V=%d, %d layers), median of calls over "
              ">= %.2f s each\n\n", C, o.V, o.layers, o.min_time);
  std::printf("%-16s %-4s %6s %6s %6s", "layer.gemm", "op", "M", "N", "K");
  for (int t : o.threads) std::printf("  %4d thr GFLOP/s", t);
  std::printf("\n");

  double peak = 0;
  int peak_threads = 0;
  std::string peak_shape;
  // mix[(rows, threads)] = {flops, seconds} over one fwd+bwd pass of all linear layers
  std::map<std::pair<int, int>, std::pair<double, double>> mix;
  for (int M : o.rows) {
    for (const auto& l : linears) {
      const gemm_shape shapes[3] = {{std::string(l.name) + ".fwd", false, true, M, l.N, l.K, 0.0f},
                                    {std::string(l.name) + ".dx", false, false, M, l.K, l.N, 1.0f},
                                    {std::string(l.name) + ".dW", true, false, l.N, l.K, M, 1.0f}};
      for (const auto& g : shapes) {
        std::printf("%-16s %-4s %6d %6d %6d", g.label.c_str(), g.ta ? "TN" : (g.tb ? "NT" : "NN"), g.m, g.n, g.k);
        for (int t : o.threads) {
          fusion::cpu::set_blas_threads(t);
          double s = time_gemm(g, a.data(), b.data(), c.data(), o.min_time);
          double rate = g.flops() / s / 1e9;
          auto& m = mix[{M, t}];
          m.first += g.flops() * l.count;
          m.second += s * l.count;
          if (rate > peak) {
            peak = rate;
            peak_threads = t;
            peak_shape = g.label + ":" + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
          }
          std::printf("  %17.1f", rate);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }

  std::printf("\nmix (all linear GEMMs of one fwd+bwd pass, total FLOPs / total time):\n");
  std::printf("%6s", "M");
  for (int t : o.threads) std::printf("  %4d thr GFLOP/s", t);
  std::printf("\n");
  for (int M : o.rows) {
    std::printf("%6d", M);
    for (int t : o.threads) {
      auto [f, s] = mix[{M, t}];
      std::printf("  %17.1f", f / s / 1e9);
    }
    std::printf("\n");
  }
  std::printf("\nRESULT peak_gflops=%.1f peak_threads=%d peak_shape=%s", peak, peak_threads, peak_shape.c_str());
  for (int t : o.threads) {
    // Best mix over the row counts for this thread count.
    double best = 0;
    for (int M : o.rows) best = std::max(best, mix[{M, t}].first / mix[{M, t}].second / 1e9);
    std::printf(" mix_gflops_t%d=%.1f", t, best);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion-bench-sgemm: %s\n", e.what());
    return 2;
  }
}
