// Softmax cross-entropy: gradients by finite differences, known values, numerical stability,
// bad targets, shape errors and cost. Shapes: B batch, T time, V vocabulary; logits (B, T, V),
// targets (B, T) i32, loss {}.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::gradcheck;
using fusion::test::random_f64;
using fusion::test::random_ids;

namespace {

std::unique_ptr<op> make_ce() { return make_op("cross_entropy", attr_map{}); }

shape_t infer(const op& o, shape_t logits, shape_t targets, dtype lt = dtype::f32, dtype tt = dtype::i32) {
  std::vector<shape_t> shapes{std::move(logits), std::move(targets)};
  std::vector<dtype> types{lt, tt};
  return o.infer_shape(shapes, types);
}

double loss_of(const op& o, const tensor& logits, const tensor& targets) {
  std::vector<tensor> saved;
  return test::run_forward(o, {logits, targets}, {}, &saved).f64()[0];
}

}  // namespace

TEST_CASE("ops/cross_entropy: gradcheck of the logits, B=2 T=3 V=5") {
  auto o = make_ce();
  std::mt19937 rng(1);
  CHECK_FALSE(o->input_has_grad(1));
  auto res = gradcheck(*o, {random_f64({2, 3, 5}, rng, 2.0), random_ids({2, 3}, 5, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/cross_entropy: uniform logits give log(V)") {
  auto o = make_ce();
  std::mt19937 rng(2);
  const int64_t V = 7;
  tensor logits({2, 3, V}, dtype::f64);
  for (int64_t i = 0; i < logits.numel(); ++i) logits.f64()[i] = 0.3;
  tensor targets = random_ids({2, 3}, V, rng);
  CHECK(loss_of(*o, logits, targets) == doctest::Approx(std::log(double(V))).epsilon(1e-14));
  // Same in the f32 training path.
  tensor l32 = logits.to(dtype::f32), y({}, dtype::f32);
  std::vector<tensor> saved;
  const tensor* ins[] = {&l32, &targets};
  o->forward({ins, {}, &y, &saved});
  CHECK(y.f32()[0] == doctest::Approx(std::log(double(V))).epsilon(1e-6));
}

TEST_CASE("ops/cross_entropy: loss equals the mean of -log softmax(target)") {
  auto o = make_ce();
  std::mt19937 rng(3);
  const int64_t N = 8, V = 11;
  tensor logits = random_f64({2, 4, V}, rng, 3.0), targets = random_ids({2, 4}, V, rng);
  double want = 0;
  for (int64_t r = 0; r < N; ++r) {
    const double* x = logits.f64() + r * V;
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(x[i]);
    want += -std::log(std::exp(x[targets.i32()[r]]) / z) / N;
  }
  CHECK(loss_of(*o, logits, targets) == doctest::Approx(want).epsilon(1e-12));
}

TEST_CASE("ops/cross_entropy: huge logits stay finite (row max is subtracted)") {
  auto o = make_ce();
  std::mt19937 rng(4);
  tensor logits = random_f64({1, 4, 6}, rng), targets = random_ids({1, 4}, 6, rng);
  const double base = loss_of(*o, logits, targets);
  tensor shifted = logits.to(dtype::f32);
  for (int64_t i = 0; i < shifted.numel(); ++i) shifted.f32()[i] += 1000.0f;
  tensor y({}, dtype::f32);
  std::vector<tensor> saved;
  const tensor* ins[] = {&shifted, &targets};
  o->forward({ins, {}, &y, &saved});
  CHECK(std::isfinite(y.f32()[0]));
  // 1000 + x in f32 keeps only ~1e-4 of x, so compare loosely.
  CHECK(y.f32()[0] == doctest::Approx(base).epsilon(1e-3));
  // The gradient is finite too and every row of it sums to zero.
  tensor dy = tensor::from({}, std::vector<float>{1.0f}), dl({1, 4, 6}, dtype::f32);
  tensor* din[] = {&dl, nullptr};
  o->backward({ins, {}, &dy, &saved, din, {}});
  for (int64_t r = 0; r < 4; ++r) {
    double s = 0;
    for (int64_t i = 0; i < 6; ++i) {
      CHECK(std::isfinite(dl.f32()[r * 6 + i]));
      s += dl.f32()[r * 6 + i];
    }
    CHECK(std::abs(s) < 1e-6);
  }
}

TEST_CASE("ops/cross_entropy: f32 forward matches f64") {
  auto o = make_ce();
  std::mt19937 rng(5);
  double d = test::f32_vs_f64_forward(*o, {random_f64({2, 3, 50}, rng, 4.0), random_ids({2, 3}, 50, rng)}, {});
  CHECK(d < 1e-5);
}

TEST_CASE("ops/cross_entropy: a target outside 0..V-1 throws op_error in forward and backward") {
  auto o = make_ce();
  std::mt19937 rng(6);
  tensor logits = random_f64({2, 3, 5}, rng);
  for (int32_t bad : {5, -1, 1 << 30}) {
    CAPTURE(bad);
    tensor targets = random_ids({2, 3}, 5, rng);
    targets.i32()[4] = bad;
    CHECK_THROWS_WITH_AS(loss_of(*o, logits, targets), doctest::Contains("target id"), op_error);
    CHECK_THROWS_WITH_AS(loss_of(*o, logits, targets), doctest::Contains("position 4"), op_error);
  }
  // Backward re-checks rather than read out of bounds if targets changed after forward.
  tensor targets = random_ids({2, 3}, 5, rng);
  std::vector<tensor> saved;
  test::run_forward(*o, {logits, targets}, {}, &saved);
  targets.i32()[5] = 9;
  tensor dy({}, dtype::f64), dl({2, 3, 5}, dtype::f64);
  dy.f64()[0] = 1;
  const tensor* ins[] = {&logits, &targets};
  tensor* din[] = {&dl, nullptr};
  CHECK_THROWS_AS(o->backward({ins, {}, &dy, &saved, din, {}}), op_error);
  for (int64_t i = 0; i < dl.numel(); ++i) CHECK(dl.f64()[i] == 0.0);  // left untouched
}

TEST_CASE("ops/cross_entropy: shape and dtype errors throw op_error naming the problem") {
  auto o = make_ce();
  CHECK(infer(*o, {2, 3, 5}, {2, 3}) == shape_t{});
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 5}, {2, 4}), doctest::Contains("does not match"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 5}, {2, 3, 5}), doctest::Contains("targets shape"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {5}, {}), doctest::Contains("(B, T, V)"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 5}, {2, 3}, dtype::f32, dtype::f32), doctest::Contains("i32"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 5}, {2, 3}, dtype::i32), doctest::Contains("logits"), op_error);
  std::vector<shape_t> one{{2, 3, 5}};
  std::vector<dtype> types{dtype::f32};
  CHECK_THROWS_WITH_AS(o->infer_shape(one, types), doctest::Contains("2 inputs"), op_error);
}

TEST_CASE("ops/cross_entropy: cost is 4 flops per logit each way") {
  std::vector<shape_t> in{{8, 128, 65}, {8, 128}};
  op_cost c = make_ce()->cost(in);
  CHECK(c.flops_forward == 4.0 * 8 * 128 * 65);
  CHECK(c.flops_backward == 4.0 * 8 * 128 * 65);
  CHECK(c.output_bytes == 4);
  CHECK(c.param_bytes == 0);
}
