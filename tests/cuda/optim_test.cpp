// The CUDA backend's optimizer and reduction kernels against ops/optim.hpp:
// AdamW and SGD over several steps (1e-5 relative: same float formulas, possibly FMA-fused),
// sum_of_squares (1e-9 relative: both accumulate in double), add_inplace (exact).
#include <doctest/doctest.h>

#include <random>

#include "ops/optim.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

namespace {

constexpr double optim_tol = 1e-5;

void check_close(backend& g, const tensor& dev, const tensor& ref, double tol, const char* what) {
  const tensor h = g.download(dev);
  const double e = max_rel_diff(h, ref);
  CHECK_MESSAGE(e <= tol, what << " differs from the CPU by " << e);
}

}  // namespace

TEST_CASE("cuda adamw_update matches ops/optim.hpp") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(1);
  optim_config c;
  c.weight_decay = 0.1;
  for (bool decay : {true, false}) {
    tensor p = random_f32({10007}, rng), m({10007}), v({10007});
    tensor dp = g.upload(p), dm = g.zeros({10007}, dtype::f32), dv = g.zeros({10007}, dtype::f32);
    for (int64_t t = 1; t <= 3; ++t) {
      const tensor grad = random_f32({10007}, rng, 0.1f);
      const tensor dgrad = g.upload(grad);
      adamw_update(p.f32(), grad.f32(), m.f32(), v.f32(), p.numel(), t, 1e-2, c, decay, 0.7f);
      g.adamw_update(dp, dgrad, dm, dv, t, 1e-2, c, decay, 0.7f);
    }
    check_close(g, dp, p, optim_tol, "adamw p");
    check_close(g, dm, m, optim_tol, "adamw m");
    check_close(g, dv, v, optim_tol, "adamw v");
  }
  tensor p = g.zeros({4}, dtype::f32), z = g.zeros({4}, dtype::f32);
  CHECK_THROWS_AS(g.adamw_update(p, z, z, z, 0, 1e-3, c, false, 1.0f), std::invalid_argument);
}

TEST_CASE("cuda sgd_update matches ops/optim.hpp") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(2);
  optim_config c;
  c.kind = "sgd";
  for (double momentum : {0.0, 0.9}) {
    c.momentum = momentum;
    tensor p = random_f32({5000}, rng), buf({5000});
    tensor dp = g.upload(p), dbuf = g.zeros({5000}, dtype::f32);
    for (int step = 0; step < 3; ++step) {
      const tensor grad = random_f32({5000}, rng);
      sgd_update(p.f32(), grad.f32(), buf.f32(), p.numel(), 0.05, c, true, 0.5f);
      g.sgd_update(dp, g.upload(grad), dbuf, 0.05, c, true, 0.5f);
    }
    check_close(g, dp, p, optim_tol, "sgd p");
    check_close(g, dbuf, buf, optim_tol, "sgd buf");
  }
}

TEST_CASE("cuda sum_of_squares and add_inplace match the CPU") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(3);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(1000), int64_t(3) << 20}) {
    const tensor x = random_f32({n}, rng);
    const double want = sum_of_squares(x.f32(), n);
    const double got = g.sum_of_squares(g.upload(x));
    CHECK(std::abs(got - want) <= 1e-9 * std::max(1.0, want));
    CHECK(g.sum_of_squares(g.upload(x)) == got);  // deterministic
  }
  const tensor a = random_f32({3, 77}, rng), b = random_f32({3, 77}, rng);
  tensor da = g.upload(a);
  g.add_inplace(da, g.upload(b));
  tensor want = a;
  for (int64_t i = 0; i < want.numel(); ++i) want.f32()[i] += b.f32()[i];
  check_close(g, da, want, 0.0, "add_inplace");
  CHECK_THROWS_AS(g.add_inplace(da, g.zeros({4}, dtype::f32)), op_error);
}

}  // namespace fusion::test
