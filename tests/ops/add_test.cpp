// add: residual sum of two same-shaped tensors; both inputs get the output gradient.
#include <doctest/doctest.h>

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

}  // namespace

TEST_CASE("ops/add: forward sums, gradcheck, f32 matches f64") {
  std::mt19937 rng(41);
  auto o = make_op("add", attr_map());
  tensor a = random_f64({2, 3, 4}, rng), b = random_f64({2, 3, 4}, rng);
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {a, b}, {}, &saved);
  REQUIRE(y.shape() == a.shape());
  for (int64_t i = 0; i < y.numel(); ++i) CHECK(y.f64()[i] == a.f64()[i] + b.f64()[i]);
  auto r = gradcheck(*o, {a, b}, {});
  INFO(r.where);
  CHECK(r.max_error < 1e-6);
  CHECK(f32_vs_f64_forward(*o, {a, b}, {}) < 1e-5);
}

TEST_CASE("ops/add: backward accumulates into each wanted gradient and skips null ones") {
  auto o = make_op("add", attr_map());
  CHECK_FALSE(o->backward_reads_inputs());
  const tensor a, b;  // freed by the op actor after forward: backward reads no input values
  tensor dy = tensor::from({3}, std::vector<float>{1, 2, 3});
  tensor da = tensor::from({3}, std::vector<float>{10, 20, 30});
  const tensor* ins[] = {&a, &b};
  std::vector<tensor> saved;
  tensor* grads[] = {nullptr, &da};
  o->backward({ins, {}, &dy, &saved, grads, {}});
  CHECK(std::vector<float>(da.f32(), da.f32() + 3) == std::vector<float>{11, 22, 33});
}

TEST_CASE("ops/add: shape, dtype and arity errors") {
  auto o = make_op("add", attr_map());
  CHECK(infer(*o, {{2, 3}, {2, 3}}, {dtype::f32, dtype::f32}) == shape_t{2, 3});
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}, {3, 2}}, {dtype::f32, dtype::f32}),
                       doctest::Contains("add: input shapes differ: [2, 3] vs [3, 2]"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}, {2, 3}}, {dtype::f32, dtype::f64}), doctest::Contains("differ in element type"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}, {2, 3}}, {dtype::i32, dtype::i32}), doctest::Contains("input 0 must be f32"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}}, {dtype::f32}), doctest::Contains("expects 2 inputs, got 1"), op_error);
}

TEST_CASE("ops/add: a mis-wired forward call throws instead of reading out of bounds") {
  auto o = make_op("add", attr_map());
  tensor a({2, 3}, dtype::f32), b({3, 2}, dtype::f32), c({6}, dtype::f32), y({2, 3}, dtype::f32);
  std::vector<tensor> saved;
  const tensor* one[] = {&a};
  CHECK_THROWS_WITH_AS(o->forward({one, {}, &y, &saved}), doctest::Contains("forward called with 1 inputs"), op_error);
  const tensor* mismatched[] = {&a, &b};
  CHECK_THROWS_WITH_AS(o->forward({mismatched, {}, &y, &saved}), doctest::Contains("input 1 has shape [3, 2]"),
                       op_error);
  const tensor* ok[] = {&a, &a};
  CHECK_THROWS_WITH_AS(o->forward({ok, {}, &c, &saved}), doctest::Contains("output has shape [6], expected [2, 3]"),
                       op_error);
}

TEST_CASE("ops/add: cost") {
  auto c = make_op("add", attr_map())->cost(std::vector<shape_t>{{2, 3, 4}, {2, 3, 4}});
  CHECK(c.flops_forward == 24);
  CHECK(c.flops_backward == 48);
  CHECK(c.output_bytes == 24 * 4);
  CHECK(c.param_bytes == 0);
  CHECK_THROWS_WITH_AS(make_op("add", attr_map())->cost(std::vector<shape_t>{{2, 3}}),
                       doctest::Contains("cost() expects 2 input shapes, got 1"), op_error);
}
