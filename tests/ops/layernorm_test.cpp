// Layer norm: gradients by finite differences, f32/f64 agreement, normalisation property,
// shape errors and cost. Shapes: B batch, T time, C channels.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::gradcheck;
using fusion::test::random_f64;

namespace {

std::unique_ptr<op> make_layernorm(const std::string& eps = "") {
  attr_map a;
  if (!eps.empty()) a.set("eps", eps);
  return make_op("layernorm", a);
}

shape_t infer(const op& o, shape_t s, dtype t = dtype::f32) {
  std::vector<shape_t> shapes{std::move(s)};
  std::vector<dtype> types{t};
  return o.infer_shape(shapes, types);
}

}  // namespace

TEST_CASE("ops/layernorm: gradcheck of input, weight and bias") {
  auto o = make_layernorm();
  std::mt19937 rng(1);
  const int64_t B = 2, T = 3, C = 4;
  auto res = gradcheck(*o, {random_f64({B, T, C}, rng)}, {random_f64({C}, rng), random_f64({C}, rng)});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/layernorm: gradcheck on a 2-D input with a large eps") {
  auto o = make_layernorm("0.5");
  std::mt19937 rng(2);
  auto res = gradcheck(*o, {random_f64({5, 7}, rng, 3.0)}, {random_f64({7}, rng), random_f64({7}, rng)});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/layernorm: f32 forward matches f64") {
  auto o = make_layernorm();
  std::mt19937 rng(3);
  const int64_t C = 16;
  double d = test::f32_vs_f64_forward(*o, {random_f64({2, 3, C}, rng, 2.0)},
                                      {random_f64({C}, rng), random_f64({C}, rng)});
  CHECK(d < 1e-5);
}

TEST_CASE("ops/layernorm: output equals a direct evaluation of the formula") {
  auto o = make_layernorm("1e-5");
  std::mt19937 rng(4);
  const int64_t rows = 6, C = 9;
  tensor x = random_f64({rows, C}, rng, 4.0), w = random_f64({C}, rng), b = random_f64({C}, rng);
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {w, b}, &saved);
  REQUIRE(saved.size() == 2);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.f64() + r * C;
    double m = 0, v = 0;
    for (int64_t i = 0; i < C; ++i) m += xr[i] / C;
    for (int64_t i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m) / C;
    double s = 1 / std::sqrt(v + 1e-5);
    CHECK(saved[0].f64()[r] == doctest::Approx(m).epsilon(1e-12));
    CHECK(saved[1].f64()[r] == doctest::Approx(s).epsilon(1e-12));
    for (int64_t i = 0; i < C; ++i)
      CHECK(y.f64()[r * C + i] == doctest::Approx((xr[i] - m) * s * w.f64()[i] + b.f64()[i]).epsilon(1e-12));
  }
  // With unit weight and zero bias every row comes out with mean 0 and variance ~1.
  for (int64_t i = 0; i < C; ++i) w.f64()[i] = 1, b.f64()[i] = 0;
  y = test::run_forward(*o, {x}, {w, b}, &saved);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < C; ++i) m += y.f64()[r * C + i] / C;
    for (int64_t i = 0; i < C; ++i) v += (y.f64()[r * C + i] - m) * (y.f64()[r * C + i] - m) / C;
    CHECK(std::abs(m) < 1e-12);
    CHECK(v == doctest::Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("ops/layernorm: params are weight=ones and bias=zeros of size C, no decay") {
  auto o = make_layernorm();
  std::vector<shape_t> in{{2, 3, 8}};
  auto ps = o->params(in);
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].shape == shape_t{8});
  CHECK(ps[0].init == param_init::ones);
  CHECK_FALSE(ps[0].decay);
  CHECK(ps[1].name == "bias");
  CHECK(ps[1].shape == shape_t{8});
  CHECK(ps[1].init == param_init::zeros);
  CHECK_FALSE(ps[1].decay);
  CHECK(infer(*o, {2, 3, 8}) == shape_t{2, 3, 8});
}

TEST_CASE("ops/layernorm: bad attributes and shapes throw op_error naming the problem") {
  CHECK_THROWS_WITH_AS(make_layernorm("0"), doctest::Contains("eps"), op_error);
  CHECK_THROWS_WITH_AS(make_layernorm("-1"), doctest::Contains("eps"), op_error);
  CHECK_THROWS_WITH_AS(make_layernorm("abc"), doctest::Contains("eps"), op_error);
  auto o = make_layernorm();
  CHECK_THROWS_WITH_AS(infer(*o, {}), doctest::Contains("scalar"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 0}), doctest::Contains("non-positive"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 4}, dtype::i32), doctest::Contains("i32"), op_error);
  std::vector<shape_t> two{{2, 4}, {2, 4}};
  std::vector<dtype> types{dtype::f32, dtype::f32};
  CHECK_THROWS_WITH_AS(o->infer_shape(two, types), doctest::Contains("1 input"), op_error);
}

TEST_CASE("ops/layernorm: backward with no input gradient still accumulates parameter gradients") {
  auto o = make_layernorm();
  std::mt19937 rng(5);
  const int64_t C = 4;
  tensor x = random_f64({3, C}, rng), w = random_f64({C}, rng), b = random_f64({C}, rng);
  std::vector<tensor> saved;
  test::run_forward(*o, {x}, {w, b}, &saved);
  tensor dy = random_f64({3, C}, rng), dw({C}, dtype::f64), db({C}, dtype::f64);
  db.f64()[0] = 1;  // accumulate onto a non-zero start
  const tensor* ins[] = {&x};
  const tensor* ps[] = {&w, &b};
  tensor* din[] = {nullptr};
  tensor* dps[] = {&dw, &db};
  o->backward({ins, ps, &dy, &saved, din, dps});
  for (int64_t i = 0; i < C; ++i) {
    double want = (i == 0 ? 1.0 : 0.0);
    for (int64_t r = 0; r < 3; ++r) want += dy.f64()[r * C + i];
    CHECK(db.f64()[i] == doctest::Approx(want).epsilon(1e-12));
  }
}

TEST_CASE("ops/layernorm: cost is 8 flops per element forward, 17 backward") {
  auto o = make_layernorm();
  std::vector<shape_t> in{{4, 32, 64}};
  op_cost c = o->cost(in);
  const double n = 4.0 * 32 * 64;
  CHECK(c.flops_forward == 8 * n);
  CHECK(c.flops_backward == 17 * n);
  CHECK(c.param_bytes == 2 * 64 * 4);
  CHECK(c.output_bytes == n * 4);
}
