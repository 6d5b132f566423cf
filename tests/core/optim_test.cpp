// Tests of the optimizer math against references written here from the PyTorch formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/optim.hpp"

using namespace fusion;

namespace {

// Deterministic values in [-1, 1) (no library RNG, so the test data never changes).
std::vector<float> test_values(int n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// torch.optim.AdamW, single-tensor path, in double.
struct adamw_reference {
  std::vector<double> p, m, v;
  void step(const std::vector<std::vector<float>>& grads, int t, double lr, const optim_config& c,
            bool decay, double scale) {
    const auto& g = grads[static_cast<size_t>(t - 1)];
    double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i] * scale;
      if (decay) p[i] *= 1 - lr * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
      double denom = std::sqrt(v[i]) / std::sqrt(bc2) + c.eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

}  // namespace

TEST_CASE("core/optim: adamw matches the PyTorch formulas over 3 steps") {
  const int n = 37;
  optim_config c;
  c.weight_decay = 0.1;
  c.eps = 1e-8;
  for (bool decay : {true, false}) {
    for (float scale : {1.0f, 0.5f}) {
      CAPTURE(decay);
      CAPTURE(scale);
      std::vector<float> p = test_values(n, 1), m(n, 0.0f), v(n, 0.0f);
      std::vector<std::vector<float>> grads = {test_values(n, 2), test_values(n, 3), test_values(n, 4)};
      adamw_reference ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n, 0.0),
                          std::vector<double>(n, 0.0)};
      const double lrs[3] = {1e-2, 5e-3, 2e-2};
      for (int t = 1; t <= 3; ++t) {
        adamw_update(p.data(), grads[t - 1].data(), m.data(), v.data(), n, t, lrs[t - 1], c, decay, scale);
        ref.step(grads, t, lrs[t - 1], c, decay, scale);
      }
      double max_err = 0, max_move = 0;
      auto p0 = test_values(n, 1);
      for (int i = 0; i < n; ++i) {
        max_err = std::max(max_err, std::abs(p[i] - ref.p[i]));
        max_err = std::max(max_err, std::abs(m[i] - ref.m[i]));
        max_err = std::max(max_err, std::abs(v[i] - ref.v[i]));
        max_move = std::max(max_move, std::abs(p[i] - static_cast<double>(p0[i])));
      }
      CHECK(max_err < 1e-6);
      CHECK(max_move > 1e-2);  // the update really moved the parameters
    }
  }
}

TEST_CASE("core/optim: adamw decay shrinks parameters even with zero gradients") {
  optim_config c;
  c.weight_decay = 0.5;
  std::vector<float> p{2.0f, -4.0f}, g{0.0f, 0.0f}, m{0, 0}, v{0, 0};
  adamw_update(p.data(), g.data(), m.data(), v.data(), 2, 1, 0.1, c, true, 1.0f);
  CHECK(p[0] == doctest::Approx(2.0 * 0.95));
  CHECK(p[1] == doctest::Approx(-4.0 * 0.95));
  CHECK_THROWS_AS(adamw_update(p.data(), g.data(), m.data(), v.data(), 2, 0, 0.1, c, true, 1.0f),
                  std::invalid_argument);
}

TEST_CASE("core/optim: sgd with momentum and coupled decay matches PyTorch over 3 steps") {
  const int n = 11;
  optim_config c;
  c.kind = "sgd";
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  std::vector<float> p = test_values(n, 5), buf(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rbuf(n, 0.0);
  const double lr = 0.1;
  const float scale = 0.25f;
  for (int t = 0; t < 3; ++t) {
    auto g = test_values(n, 6 + t);
    sgd_update(p.data(), g.data(), buf.data(), n, lr, c, true, scale);
    for (int i = 0; i < n; ++i) {
      double gi = g[i] * static_cast<double>(scale) + c.weight_decay * rp[i];
      rbuf[i] = t == 0 ? gi : c.momentum * rbuf[i] + gi;  // PyTorch: buf = g on the first step
      rp[i] -= lr * rbuf[i];
    }
  }
  for (int i = 0; i < n; ++i) {
    CHECK(p[i] == doctest::Approx(rp[i]).epsilon(1e-5));
    CHECK(buf[i] == doctest::Approx(rbuf[i]).epsilon(1e-5));
  }
}

TEST_CASE("core/optim: lr schedule warms up linearly then follows a cosine to min_lr") {
  optim_config c;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup_steps = 10;
  c.total_steps = 110;
  CHECK(lr_at(c, 0) == doctest::Approx(1e-4));  // lr / warmup
  for (int64_t s = 1; s < 10; ++s) CHECK(lr_at(c, s) > lr_at(c, s - 1));
  CHECK(lr_at(c, 9) == doctest::Approx(1e-3));
  CHECK(lr_at(c, 10) == doctest::Approx(1e-3));
  for (int64_t s = 11; s <= 110; ++s) CHECK(lr_at(c, s) <= lr_at(c, s - 1));
  CHECK(lr_at(c, 60) == doctest::Approx(0.5 * (1e-3 + 1e-4)));  // halfway through the cosine
  CHECK(lr_at(c, 35) == doctest::Approx(1e-4 + 0.45e-3 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(lr_at(c, 110) == doctest::Approx(1e-4));
  CHECK(lr_at(c, 5000) == doctest::Approx(1e-4));
  c.warmup_steps = 0;
  CHECK(lr_at(c, 0) == doctest::Approx(1e-3));
  CHECK_THROWS_AS(lr_at(c, -1), std::invalid_argument);
}

TEST_CASE("core/optim: clip_scale caps the global norm") {
  CHECK(clip_scale(5.0, 0.0) == 1.0f);
  CHECK(clip_scale(5.0, -1.0) == 1.0f);
  CHECK(clip_scale(0.5, 1.0) == 1.0f);
  CHECK(clip_scale(1.0, 1.0) == 1.0f);
  float s = clip_scale(4.0, 1.0);
  CHECK(s == doctest::Approx(0.25).epsilon(1e-5));
  CHECK(4.0 * s <= 1.0);
}

TEST_CASE("core/optim: sum_of_squares accumulates in double") {
  auto x = test_values(1003, 9);  // not a multiple of the unroll width
  double want = 0;
  for (float v : x) want += static_cast<double>(v) * v;
  CHECK(sum_of_squares(x.data(), 1003) == doctest::Approx(want).epsilon(1e-12));
  CHECK(sum_of_squares(x.data(), 0) == 0.0);
  // 2^24 + 1 ones would stall a float accumulator at 2^24; use a large value instead of a large n.
  std::vector<float> big{4096.0f, 1.0f};  // 2^24 + 1
  CHECK(sum_of_squares(big.data(), 2) == 16777217.0);
}

TEST_CASE("core/optim: config check names the bad field") {
  optim_config c;
  CHECK_NOTHROW(check_optim_config(c));
  CHECK(optim_state_count(c) == 2);
  auto message = [](optim_config bad) {
    try {
      check_optim_config(bad);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  c.kind = "adam";
  CHECK(message(c).find("kind") != std::string::npos);
  c = {};
  c.beta2 = 1.0;
  CHECK(message(c).find("beta2") != std::string::npos);
  c = {};
  c.lr = std::nan("");
  CHECK(message(c).find("lr") != std::string::npos);
  c = {};
  c.total_steps = -1;
  CHECK(message(c).find("optim.total-steps") != std::string::npos);
  c = {};
  c.kind = "sgd";
  CHECK(optim_state_count(c) == 1);
}

TEST_CASE("core/optim: config messages name the options a user writes, with plain numbers") {
  auto message = [](optim_config bad) {
    try {
      check_optim_config(bad);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Every field, by the option name of docs/training.md; no C++ field name (min_lr, weight_decay,
  // warmup_steps, total_steps, grad_clip) and no std::to_string padding (-1.000000).
  struct bad_case {
    void (*spoil)(optim_config&);
    const char* option;
    const char* value;
  };
  const bad_case cases[] = {
      {[](optim_config& c) { c.kind = "adam"; }, "optim.kind", "\"adam\""},
      {[](optim_config& c) { c.lr = -1; }, "optim.lr", "got -1"},
      {[](optim_config& c) { c.min_lr = -0.5; }, "optim.min-lr", "got -0.5"},
      {[](optim_config& c) { c.beta1 = 1.5; }, "optim.beta1", "got 1.5"},
      {[](optim_config& c) { c.beta2 = 1; }, "optim.beta2", "got 1"},
      {[](optim_config& c) { c.eps = 0; }, "optim.eps", "got 0"},
      {[](optim_config& c) { c.weight_decay = -0.1; }, "optim.weight-decay", "got -0.1"},
      {[](optim_config& c) { c.momentum = 1; }, "optim.momentum", "got 1"},
      {[](optim_config& c) { c.grad_clip = std::nan(""); }, "optim.grad-clip", "nan"},
      {[](optim_config& c) { c.warmup_steps = -2; }, "optim.warmup-steps", "got -2"},
      {[](optim_config& c) { c.total_steps = -1; }, "optim.total-steps", "got -1"},
      {[](optim_config& c) { c.outer_lr = 0; }, "train.outer-lr", "got 0"},
      {[](optim_config& c) { c.outer_momentum = 1; }, "train.outer-momentum", "got 1"},
  };
  for (auto& k : cases) {
    optim_config c;
    k.spoil(c);
    std::string m = message(c);
    CAPTURE(m);
    CHECK(m.rfind(k.option, 0) == 0);
    CHECK(m.find(k.value) != std::string::npos);
    for (const char* internal : {"_", "optimizer config", ".000000"}) CHECK(m.find(internal) == std::string::npos);
  }
}

TEST_CASE("core/optim: train.sync parses step and local:H, and refuses the rest") {
  int64_t every = -7;
  CHECK(parse_sync("step", every));
  CHECK(every == 0);
  CHECK(parse_sync("local:20", every));
  CHECK(every == 20);
  CHECK(sync_name(20) == "local:20");
  CHECK(sync_name(0) == "step");
  for (const char* bad : {"", "local", "local:", "local:0", "local:-1", "local:2x", "Local:2", "steps", "local:9999999999"}) {
    CAPTURE(bad);
    every = 5;
    CHECK_FALSE(parse_sync(bad, every));
    CHECK(every == 5);  // left as it was
  }
}

TEST_CASE("core/optim: the outer update is torch.optim.SGD with Nesterov momentum over 3 syncs") {
  // Reference in double: buf = mu buf + d; p -= lr (d + mu buf), as torch.optim.SGD(nesterov=True).
  const double lr = 0.7, mu = 0.9;
  std::vector<float> p = {0.5f, -1.25f, 2.0f}, buf(3, 0.0f);
  std::vector<double> pd(p.begin(), p.end()), bd(3, 0.0);
  const std::vector<std::vector<float>> deltas = {{0.1f, -0.2f, 0.05f}, {0.02f, 0.3f, -0.1f}, {-0.05f, 0.0f, 0.2f}};
  for (auto& d : deltas) {
    outer_update(p.data(), d.data(), buf.data(), 3, lr, mu);
    for (int i = 0; i < 3; ++i) {
      bd[i] = mu * bd[i] + d[i];
      pd[i] -= lr * (d[i] + mu * bd[i]);
    }
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(p[i] == doctest::Approx(pd[i]).epsilon(1e-6));
    CHECK(buf[i] == doctest::Approx(bd[i]).epsilon(1e-6));
  }
  // lr 1, momentum 0: the anchor minus the mean change, i.e. the mean of the replicas' values.
  std::vector<float> anchor = {1.0f, 2.0f}, zero(2, 0.0f);
  const std::vector<float> mean_delta = {0.25f, -0.5f};  // replicas at (0.5, 2.5) and (1.0, 2.5)
  outer_update(anchor.data(), mean_delta.data(), zero.data(), 2, 1.0, 0.0);
  CHECK(anchor[0] == 0.75f);
  CHECK(anchor[1] == 2.5f);
}
