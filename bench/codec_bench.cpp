// fusion-bench-codec: the CPU edge codecs on one core.
//
// Table 1, topk (compression/topk.hpp). For fp32 tensors of 4 MiB and 64 MiB (normal random
// data), block 4096, fp16 values, at 1%, 10% and 30% kept: encode and decode rates (dense fp32
// bytes / seconds, best of several repetitions), next to two references measured in the same run
// on the same buffer size:
//   memcpy       copying the dense tensor (the bandwidth bar: the target is encode >= 25% of it)
//   nth_element  a global top-k threshold the textbook way: |x| into a scratch copy, then
//                std::nth_element (no payload built)
//
// Table 2, every codec side by side (and the block size of int8 / int4, compression/quant.hpp):
// for a 16 MiB fp32 tensor, the payload over the dense bytes, encode and decode rates (dense
// bytes / second, best of several), the RMS error over the tensor's RMS on normal data and on
// heavy-tailed data (normal, with 1% of the elements 30x larger: the outlier features of
// transformer activations), beside memcpy measured in the same run. f16 is topk keep-all with
// f16 values (AdaTopK's first rung); int8 and int4 also on the scalar path, to show what the
// run-time chosen SIMD path gains.
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

#include "compression/quant.hpp"
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

// ||x - y|| / ||x||
double relative_rms(const std::vector<float>& x, const std::vector<float>& y) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    norm += double{x[i]} * x[i];
  }
  return std::sqrt(diff / norm);
}

struct codec_row {
  std::string name;
  std::function<void(const std::vector<float>&, std::vector<std::byte>&)> encode;
  std::function<status(const std::vector<std::byte>&, std::vector<float>&)> decode;
};

int codec_table(bool quick) {
  const size_t n = size_t{16} << 18, bytes = n * sizeof(float);
  const int reps = quick ? 3 : 15;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(n), heavy(n), copy(n), dense(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = normal(rng);
    heavy[i] = normal(rng) * (unit(rng) < 0.01f ? 30.0f : 1.0f);
  }
  std::memset(copy.data(), 0, bytes);
  std::memset(dense.data(), 0, bytes);
  const double t_memcpy = best_seconds(reps, [&] { std::memcpy(copy.data(), x.data(), bytes); });

  std::vector<codec_row> rows;
  rows.push_back({"f16 (topk keep-all)",
                  [](const std::vector<float>& v, std::vector<std::byte>& p) {
                    encode_topk(v, keep_all_ratio, value_type::f16, 4096, p);
                  },
                  [](const std::vector<std::byte>& p, std::vector<float>& d) { return decode_topk(p, d); }});
  rows.push_back({"topk 10% f16",
                  [](const std::vector<float>& v, std::vector<std::byte>& p) {
                    encode_topk(v, 0.1, value_type::f16, 4096, p);
                  },
                  [](const std::vector<std::byte>& p, std::vector<float>& d) { return decode_topk(p, d); }});
  // AdaTopK's last rungs: the kept values as int8 with a scale per 64 of them.
  rows.push_back({"topk 10% int8 /64",
                  [](const std::vector<float>& v, std::vector<std::byte>& p) {
                    encode_topk(v, 0.1, value_type::int8, 4096, p, 64);
                  },
                  [](const std::vector<std::byte>& p, std::vector<float>& d) { return decode_topk(p, d); }});
  auto decode_q = [](const std::vector<std::byte>& p, std::vector<float>& d) { return decode_quant(p, d); };
  for (const unsigned bits : {8u, 4u}) {
    for (const uint32_t block : {32u, 64u, 128u, 256u})
      rows.push_back({"int" + std::to_string(bits) + " /" + std::to_string(block) + " " + to_string(quant_best_path()),
                      [=](const std::vector<float>& v, std::vector<std::byte>& p) { encode_quant(v, bits, block, p); },
                      decode_q});
    rows.push_back({"int" + std::to_string(bits) + " /64 scalar",
                    [=](const std::vector<float>& v, std::vector<std::byte>& p) {
                      encode_quant(v, bits, 64, p, quant_path::scalar);
                    },
                    decode_q});
  }

  std::printf("\nevery codec, one core, %zu MiB fp32 tensor, best of %d; err = RMS error / RMS of the tensor\n",
              bytes >> 20, reps);
  std::printf("%-22s %9s %9s %9s %11s %11s %11s\n", "codec", "bytes", "encode", "decode", "err normal",
              "err heavy", "enc/memcpy");
  std::printf("%-22s %9s %9s %9s %11s %11s %11s\n", "", "/ dense", "GB/s", "GB/s", "", "", "");
  std::printf("%-22s %9.3f %9.2f %9.2f %11s %11s %10.0f%%\n", "memcpy", 1.0, gbps(bytes, t_memcpy),
              gbps(bytes, t_memcpy), "0", "0", 100.0);
  for (const codec_row& r : rows) {
    std::vector<std::byte> payload;
    r.encode(heavy, payload);
    if (auto s = r.decode(payload, dense); !s) {
      std::fprintf(stderr, "fusion-bench-codec: %s: decode failed: %s\n", r.name.c_str(), s.error().c_str());
      return 1;
    }
    const double err_heavy = relative_rms(heavy, dense);
    r.encode(x, payload);
    const double t_enc = best_seconds(reps, [&] { r.encode(x, payload); });
    status decoded;
    const double t_dec = best_seconds(reps, [&] { decoded = r.decode(payload, dense); });
    if (!decoded) {
      std::fprintf(stderr, "fusion-bench-codec: %s: decode failed: %s\n", r.name.c_str(), decoded.error().c_str());
      return 1;
    }
    std::printf("%-22s %9.3f %9.2f %9.2f %11.2e %11.2e %10.0f%%\n", r.name.c_str(),
                static_cast<double>(payload.size()) / static_cast<double>(bytes), gbps(bytes, t_enc),
                gbps(bytes, t_dec), relative_rms(x, dense), err_heavy, 100.0 * t_memcpy / t_enc);
  }
  return 0;
}

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
  return codec_table(quick);
}
