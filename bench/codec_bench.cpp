// fusion-bench-codec: the CPU topk edge codec (compression/topk.hpp) on one core.
//
// For fp32 tensors of 4 MiB and 64 MiB (normal random data), block 4096, fp16 values, at 1%,
// 10% and 30% kept: encode and decode rates (dense fp32 bytes / seconds, best of several
// repetitions), next to two references measured in the same run on the same buffer size:
//   memcpy       copying the dense tensor (the bandwidth bar: the target is encode >= 25% of it)
//   nth_element  a global top-k threshold the textbook way: |x| into a scratch copy, then
//                std::nth_element (no payload built)
//
//   fusion-bench-codec [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compression/topk.hpp"

using namespace fusion;

namespace {

using clock_type = std::chrono::steady_clock;

// Best (smallest) seconds of `reps` runs of fn.
double best_seconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

double gbps(size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: fusion-bench-codec [--quick]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const uint32_t block = 4096;
  const value_type values = value_type::f16;
  const double ratios[] = {0.01, 0.10, 0.30};
  std::printf("fusion-bench-codec: topk encode/decode on one core, fp32 normal data, block %u, %s values%s\n",
              block, to_string(values).c_str(), quick ? " (--quick)" : "");
  std::printf("rates are dense fp32 bytes / second (GB/s = 1e9 B/s), best of %s repetitions (nth_element: of\n"
              "up to 5); enc/memcpy is the encode rate over the memcpy rate (the target is >= 25%% at 10%%)\n\n",
              quick ? "20 (4 MiB) and 3 (64 MiB)" : "200 (4 MiB) and 15 (64 MiB)");
  std::printf("%8s %6s %10s %9s %9s %9s %9s %12s\n", "tensor", "kept", "payload", "encode", "decode", "memcpy",
              "nth_elem", "enc/memcpy");
  std::printf("%8s %6s %10s %9s %9s %9s %9s %12s\n", "", "", "MB", "GB/s", "GB/s", "GB/s", "GB/s", "");

  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t mib : {size_t{4}, size_t{64}}) {
    const size_t n = mib << 18, bytes = n * sizeof(float);
    const int reps = quick ? (mib > 8 ? 3 : 20) : (mib > 8 ? 15 : 200);  // many: the VM is noisy
    std::vector<float> x(n), copy(n), dense(n);
    for (auto& v : x) v = normal(rng);
    std::memset(copy.data(), 0, bytes);  // touch every page before timing

    const double t_memcpy = best_seconds(reps, [&] { std::memcpy(copy.data(), x.data(), bytes); });
    for (double ratio : ratios) {
      const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(ratio * static_cast<double>(n))));
      const double t_nth = best_seconds(std::max(1, std::min(5, reps / 3)), [&] {
        for (size_t i = 0; i < n; ++i) copy[i] = std::fabs(x[i]);
        std::nth_element(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(k - 1), copy.end(), std::greater<>());
      });
      std::vector<std::byte> payload;
      encode_topk(x, ratio, values, block, payload);  // sizes the payload once
      const double t_enc = best_seconds(reps, [&] { encode_topk(x, ratio, values, block, payload); });
      status decoded;
      const double t_dec = best_seconds(reps, [&] { decoded = decode_topk(payload, dense); });
      if (!decoded) {
        std::fprintf(stderr, "fusion-bench-codec: decode failed: %s\n", decoded.error().c_str());
        return 1;
      }
      std::printf("%5zu MiB %5.0f%% %10.2f %9.2f %9.2f %9.2f %9.2f %11.0f%%\n", mib, ratio * 100,
                  static_cast<double>(payload.size()) / 1e6, gbps(bytes, t_enc), gbps(bytes, t_dec),
                  gbps(bytes, t_memcpy), gbps(bytes, t_nth), 100.0 * t_memcpy / t_enc);
    }
  }
  return 0;
}
