// gelu (tanh approximation) and relu: values against libm formulas, gradients, precision, cost.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::f32_vs_f64_forward;
using fusion::test::gradcheck;
using fusion::test::infer;
using fusion::test::random_f64;

namespace {

// Reference GELU (PyTorch approximate='tanh') and its derivative, in double with libm.
double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad_ref(double x) {
  const double h = 1e-5;
  return (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
}

// Runs forward and backward (dy = 1) of a unary op in f32 on the given values.
std::pair<std::vector<float>, std::vector<float>> run_f32(const op& o, const std::vector<float>& xs) {
  const int64_t n = static_cast<int64_t>(xs.size());
  tensor x = tensor::from({n}, xs), y({n}, dtype::f32), dy({n}, dtype::f32), dx({n}, dtype::f32);
  dy.fill(1.0f);
  const tensor* ins[] = {&x};
  tensor* din[] = {&dx};
  std::vector<tensor> saved;
  o.forward({ins, {}, &y, &saved});
  o.backward({ins, {}, &dy, &saved, din, {}});
  return {std::vector<float>(y.f32(), y.f32() + n), std::vector<float>(dx.f32(), dx.f32() + n)};
}

}  // namespace

TEST_CASE("ops/gelu: f32 values and derivative match the libm tanh formula over a wide range") {
  auto o = make_op("gelu", attr_map());
  std::vector<float> xs;
  for (int i = -2000; i <= 2000; ++i) xs.push_back(static_cast<float>(i) * 0.01f);  // [-20, 20]
  xs.push_back(1e-30f);
  xs.push_back(-1e-30f);
  auto [y, dx] = run_f32(*o, xs);
  double worst_y = 0, worst_dx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    worst_y = std::max(worst_y, std::abs(y[i] - gelu_ref(xs[i])) / std::max(1.0, std::abs(gelu_ref(xs[i]))));
    worst_dx = std::max(worst_dx, std::abs(dx[i] - gelu_grad_ref(xs[i])));
  }
  CHECK(worst_y < 1e-6);
  CHECK(worst_dx < 1e-5);
  // Landmarks: gelu(0) = 0, identity far right, zero far left, derivative 0.5 at 0.
  CHECK(y[2000] == 0.0f);
  CHECK(std::abs(y.back()) < 1e-29f);
  CHECK(y[4000] == doctest::Approx(20.0));
  CHECK(std::abs(y[0]) < 1e-30);
  CHECK(dx[2000] == doctest::Approx(0.5));
}

TEST_CASE("ops/gelu: gradcheck and f32 matches f64") {
  std::mt19937 rng(31);
  auto o = make_op("gelu", attr_map());
  tensor x = random_f64({2, 3, 4}, rng, 3.0);
  auto r = gradcheck(*o, {x}, {});
  INFO(r.where);
  CHECK(r.max_error < 1e-6);
  CHECK(f32_vs_f64_forward(*o, {x}, {}) < 1e-5);
}

TEST_CASE("ops/relu: values, gradcheck away from the kink, f32 matches f64") {
  std::mt19937 rng(32);
  auto o = make_op("relu", attr_map());
  auto [y, dx] = run_f32(*o, {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f});
  CHECK(y == std::vector<float>{0, 0, 0, 0.5f, 3});
  CHECK(dx == std::vector<float>{0, 0, 0, 1, 1});
  tensor x = random_f64({2, 3, 4}, rng);
  // Finite differences are meaningless within eps of 0: push every value at least 0.05 away.
  for (int64_t i = 0; i < x.numel(); ++i) x.f64()[i] += x.f64()[i] < 0 ? -0.05 : 0.05;
  auto r = gradcheck(*o, {x}, {});
  INFO(r.where);
  CHECK(r.max_error < 1e-6);
  CHECK(f32_vs_f64_forward(*o, {x}, {}) < 1e-5);
}

TEST_CASE("ops/activation: any shape passes through, dtype and arity errors") {
  for (const char* kind : {"gelu", "relu"}) {
    CAPTURE(kind);
    auto o = make_op(kind, attr_map());
    CHECK(infer(*o, {{2, 3, 4}}, {dtype::f32}) == shape_t{2, 3, 4});
    CHECK(infer(*o, {{7}}, {dtype::f64}) == shape_t{7});
    CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}}, {dtype::i32}), doctest::Contains("must be f32 or f64, got i32"),
                         op_error);
    CHECK_THROWS_WITH_AS(infer(*o, {{2}, {2}}, {dtype::f32, dtype::f32}), doctest::Contains("expects 1 input"),
                         op_error);
    CHECK_THROWS_WITH_AS(infer(*o, {{2, -1}}, {dtype::f32}), doctest::Contains("negative dimension"), op_error);
    CHECK(o->params(std::vector<shape_t>{{2, 3}}).empty());
  }
}

TEST_CASE("ops/activation: cost counts per-element FLOPs") {
  std::vector<shape_t> in{{2, 3, 4}};
  const double n = 24;
  auto g = make_op("gelu", attr_map())->cost(in);
  CHECK(g.flops_forward == 9 * n);   // see the FLOP table in ops/cpu/activation.cpp
  CHECK(g.flops_backward == 18 * n);
  CHECK(g.output_bytes == n * 4);
  auto r = make_op("relu", attr_map())->cost(in);
  CHECK(r.flops_forward == n);
  CHECK(r.flops_backward == 2 * n);
}
