#include "core/param_init.hpp"

#include <cmath>
#include <random>

namespace fusion {

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void init_param(tensor& t, const param_spec& spec, uint64_t seed, const std::string& key) {
  t = tensor(spec.shape, dtype::f32);
  switch (spec.init) {
    case param_init::zeros:
      return;
    case param_init::ones:
      t.fill(1.0f);
      return;
    case param_init::normal: {
      // Box-Muller over mt19937_64 rather than std::normal_distribution, whose algorithm is
      // implementation-defined: checkpoints must mean the same thing on every node build.
      std::mt19937_64 rng(seed ^ fnv1a64(key));
      const double two_pi = 6.283185307179586;
      auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
      float* p = t.f32();
      for (int64_t i = 0; i < t.numel(); i += 2) {
        double r = std::sqrt(-2.0 * std::log(uniform())), a = two_pi * uniform();
        p[i] = static_cast<float>(spec.stddev * r * std::cos(a));
        if (i + 1 < t.numel()) p[i + 1] = static_cast<float>(spec.stddev * r * std::sin(a));
      }
      return;
    }
  }
}

tensor init_buffer(const buffer_spec& spec) {
  tensor t(spec.shape, dtype::f32);
  t.fill(spec.init == param_init::ones ? 1.0f : 0.0f);
  return t;
}

}  // namespace fusion
