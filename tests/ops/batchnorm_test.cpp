// Batch norm: gradients by finite differences in training mode, the running-statistics update,
// evaluation mode as a folded affine transform, f32/f64 agreement, shape errors and cost.
// Shapes: B batch, C channels, H x W pixels.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::gradcheck;
using fusion::test::random_f64;

namespace {

std::unique_ptr<op> make_batchnorm(const std::string& eps = "", const std::string& momentum = "") {
  attr_map a;
  if (!eps.empty()) a.set("eps", eps);
  if (!momentum.empty()) a.set("momentum", momentum);
  return make_op("batchnorm2d", a);
}

shape_t infer(const op& o, shape_t s, dtype t = dtype::f32) {
  std::vector<shape_t> shapes{std::move(s)};
  std::vector<dtype> types{t};
  return o.infer_shape(shapes, types);
}

/// Positive random running variances, so evaluation mode has something non-trivial to fold.
tensor random_var(int64_t C, std::mt19937& rng) {
  tensor v = random_f64({C}, rng);
  for (int64_t c = 0; c < C; ++c) v.f64()[c] = 0.5 + std::abs(v.f64()[c]);
  return v;
}

}  // namespace

TEST_CASE("ops/batchnorm2d: gradcheck of input, weight and bias in training mode") {
  auto o = make_batchnorm();
  std::mt19937 rng(1);
  const int64_t B = 2, C = 3, H = 2, W = 3;
  auto res = gradcheck(*o, {random_f64({B, C, H, W}, rng, 2.0)}, {random_f64({C}, rng), random_f64({C}, rng)});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/batchnorm2d: gradcheck on a (B, C) input with a large eps") {
  auto o = make_batchnorm("0.5");
  std::mt19937 rng(2);
  auto res = gradcheck(*o, {random_f64({5, 4}, rng, 3.0)}, {random_f64({4}, rng), random_f64({4}, rng)});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/batchnorm2d: training output, saved statistics and running-statistics update") {
  auto o = make_batchnorm("1e-5", "0.3");
  std::mt19937 rng(3);
  const int64_t B = 3, C = 2, S = 4;  // (B, C, 2, 2)
  tensor x = random_f64({B, C, 2, 2}, rng, 4.0), w = random_f64({C}, rng), b = random_f64({C}, rng);
  std::vector<tensor> buffers{random_f64({C}, rng), random_var(C, rng)};
  const std::vector<tensor> before = buffers;
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {w, b}, &saved, &buffers, true);
  REQUIRE(saved.size() == 2);
  const double n = B * S;
  for (int64_t c = 0; c < C; ++c) {
    double m = 0, v = 0;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) m += x.f64()[(bi * C + c) * S + i] / n;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) v += std::pow(x.f64()[(bi * C + c) * S + i] - m, 2) / n;
    const double s = 1 / std::sqrt(v + 1e-5);
    CHECK(saved[0].f64()[c] == doctest::Approx(m).epsilon(1e-12));
    CHECK(saved[1].f64()[c] == doctest::Approx(s).epsilon(1e-12));
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t k = (bi * C + c) * S + i;
        CHECK(y.f64()[k] == doctest::Approx((x.f64()[k] - m) * s * w.f64()[c] + b.f64()[c]).epsilon(1e-12));
      }
    // PyTorch's update: the running variance takes the unbiased batch variance (n / (n - 1)).
    CHECK(buffers[0].f64()[c] == doctest::Approx(0.7 * before[0].f64()[c] + 0.3 * m).epsilon(1e-12));
    CHECK(buffers[1].f64()[c] == doctest::Approx(0.7 * before[1].f64()[c] + 0.3 * v * n / (n - 1)).epsilon(1e-12));
  }
}

TEST_CASE("ops/batchnorm2d: default buffers move from zeros/ones by the default momentum 0.1") {
  auto o = make_batchnorm();
  tensor x({4, 1}, dtype::f64);
  for (int i = 0; i < 4; ++i) x.f64()[i] = i;  // mean 1.5, unbiased variance 5/3
  tensor w({1}, dtype::f64), b({1}, dtype::f64);
  w.f64()[0] = 1;
  std::vector<tensor> buffers = test::default_buffers(*o, {x}, dtype::f64), saved;
  CHECK(buffers[0].f64()[0] == 0.0);
  CHECK(buffers[1].f64()[0] == 1.0);
  test::run_forward(*o, {x}, {w, b}, &saved, &buffers, true);
  CHECK(buffers[0].f64()[0] == doctest::Approx(0.15).epsilon(1e-12));
  CHECK(buffers[1].f64()[0] == doctest::Approx(0.9 + 0.1 * 5.0 / 3.0).epsilon(1e-12));
}

TEST_CASE("ops/batchnorm2d: evaluation mode is the folded affine transform and leaves buffers alone") {
  const double eps = 1e-3;
  auto o = make_batchnorm("1e-3");
  std::mt19937 rng(4);
  const int64_t B = 2, C = 3, S = 6;  // (B, C, 2, 3)
  tensor x = random_f64({B, C, 2, 3}, rng, 3.0), w = random_f64({C}, rng), b = random_f64({C}, rng);
  std::vector<tensor> buffers{random_f64({C}, rng), random_var(C, rng)};
  const std::vector<tensor> before = buffers;
  std::vector<tensor> saved{tensor({C}, dtype::f64)};  // stale contents must go
  tensor y = test::run_forward(*o, {x}, {w, b}, &saved, &buffers, false);
  CHECK(saved.empty());
  CHECK(max_rel_diff(buffers[0], before[0]) == 0.0);
  CHECK(max_rel_diff(buffers[1], before[1]) == 0.0);
  for (int64_t c = 0; c < C; ++c) {
    const double a = w.f64()[c] / std::sqrt(before[1].f64()[c] + eps);
    const double shift = b.f64()[c] - before[0].f64()[c] * a;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t k = (bi * C + c) * S + i;
        CHECK(y.f64()[k] == doctest::Approx(x.f64()[k] * a + shift).epsilon(1e-12));
      }
  }
  // Backward needs batch statistics, which an evaluation forward does not save.
  tensor dy = random_f64(x.shape(), rng), dx(x.shape(), dtype::f64);
  const tensor* ins[] = {&x};
  const tensor* ps[] = {&w, &b};
  tensor* dins[] = {&dx};
  tensor* dps[] = {nullptr, nullptr};
  CHECK_THROWS_WITH_AS(o->backward({ins, ps, &dy, &saved, dins, dps}), doctest::Contains("training"), op_error);
}

TEST_CASE("ops/batchnorm2d: f32 forward matches f64 and writes every element in both modes") {
  auto o = make_batchnorm();
  std::mt19937 rng(5);
  const int64_t C = 4;
  tensor x = random_f64({3, C, 4, 5}, rng, 2.0), w = random_f64({C}, rng), b = random_f64({C}, rng);
  CHECK(test::f32_vs_f64_forward(*o, {x}, {w, b}) < 1e-5);
  std::vector<tensor> x32{x.to(dtype::f32)}, p32{w.to(dtype::f32), b.to(dtype::f32)}, saved;
  std::vector<tensor> buffers{random_f64({C}, rng).to(dtype::f32), random_var(C, rng).to(dtype::f32)};
  int64_t unwritten = -1;
  test::forward_poisoned(*o, x32, p32, &saved, dtype::f32, unwritten, &buffers, false);
  CHECK(unwritten == 0);
  test::forward_poisoned(*o, x32, p32, &saved, dtype::f32, unwritten, &buffers, true);
  CHECK(unwritten == 0);
  CHECK(saved.size() == 2);
}

TEST_CASE("ops/batchnorm2d: training on one value per channel is an error, evaluation is not") {
  auto o = make_batchnorm();
  tensor x({1, 3}, dtype::f64), w({3}, dtype::f64), b({3}, dtype::f64);
  std::vector<tensor> saved;
  int64_t unwritten = 0;
  CHECK_THROWS_WITH_AS(test::forward_poisoned(*o, {x}, {w, b}, &saved, dtype::f64, unwritten),
                       doctest::Contains("more than one value per channel, got input [1, 3]"), op_error);
  test::forward_poisoned(*o, {x}, {w, b}, &saved, dtype::f64, unwritten, nullptr, false);
  CHECK(unwritten == 0);
  // (1, C, 1, 2) has two values per channel: fine.
  tensor x2({1, 3, 1, 2}, dtype::f64);
  x2.f64()[1] = 1;
  test::forward_poisoned(*o, {x2}, {w, b}, &saved, dtype::f64, unwritten);
  CHECK(unwritten == 0);
}

TEST_CASE("ops/batchnorm2d: params weight=ones, bias=zeros, buffers running_mean=zeros, running_var=ones") {
  auto o = make_batchnorm();
  std::vector<shape_t> in{{2, 8, 5, 5}};
  auto ps = o->params(in);
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].shape == shape_t{8});
  CHECK(ps[0].init == param_init::ones);
  CHECK_FALSE(ps[0].decay);
  CHECK(ps[1].name == "bias");
  CHECK(ps[1].init == param_init::zeros);
  CHECK_FALSE(ps[1].decay);
  auto bs = o->buffers(in);
  REQUIRE(bs.size() == 2);
  CHECK(bs[0].name == "running_mean");
  CHECK(bs[0].shape == shape_t{8});
  CHECK(bs[0].init == param_init::zeros);
  CHECK(bs[1].name == "running_var");
  CHECK(bs[1].shape == shape_t{8});
  CHECK(bs[1].init == param_init::ones);
  CHECK(infer(*o, {2, 8, 5, 5}) == shape_t{2, 8, 5, 5});
  CHECK(infer(*o, {2, 8}) == shape_t{2, 8});
}

TEST_CASE("ops/batchnorm2d: bad attributes, shapes and calls throw op_error naming the problem") {
  CHECK_THROWS_WITH_AS(make_batchnorm("0"), doctest::Contains("eps"), op_error);
  CHECK_THROWS_WITH_AS(make_batchnorm("abc"), doctest::Contains("eps"), op_error);
  CHECK_THROWS_WITH_AS(make_batchnorm("", "1.5"), doctest::Contains("momentum"), op_error);
  CHECK_THROWS_WITH_AS(make_batchnorm("", "-0.1"), doctest::Contains("momentum"), op_error);
  CHECK_NOTHROW(make_batchnorm("", "0"));
  CHECK_NOTHROW(make_batchnorm("", "1"));
  auto o = make_batchnorm();
  CHECK_THROWS_WITH_AS(infer(*o, {4}), doctest::Contains("rank >= 2"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 0, 3, 3}), doctest::Contains("non-positive"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 4}, dtype::i32), doctest::Contains("i32"), op_error);
  // A forward without the running statistics is a wiring error, not a silent skip.
  tensor x({2, 3}, dtype::f64), w({3}, dtype::f64), b({3}, dtype::f64), y({2, 3}, dtype::f64);
  std::vector<tensor> saved;
  const tensor* ins[] = {&x};
  const tensor* ps[] = {&w, &b};
  CHECK_THROWS_WITH_AS(o->forward({ins, ps, &y, &saved}), doctest::Contains("running_mean"), op_error);
  tensor dy({2, 3}, dtype::f64);
  tensor* dins[] = {nullptr};
  tensor* dps[] = {nullptr, nullptr};
  CHECK_THROWS_WITH_AS(o->backward({ins, ps, &dy, &saved, dins, dps}), doctest::Contains("saved"), op_error);
}

TEST_CASE("ops/batchnorm2d: cost is 8 flops per element forward, 12 backward") {
  auto o = make_batchnorm();
  std::vector<shape_t> in{{4, 16, 8, 8}};
  op_cost c = o->cost(in);
  const double n = 4.0 * 16 * 64;
  CHECK(c.flops_forward == 8 * n);
  CHECK(c.flops_backward == 12 * n);
  CHECK(c.param_bytes == 2 * 16 * 4);
  CHECK(c.output_bytes == n * 4);
  CHECK(c.bytes_forward > 2 * n * 4);
  CHECK(c.bytes_backward > 4 * n * 4);
}
