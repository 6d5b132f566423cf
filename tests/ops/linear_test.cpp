// linear: y = x W^T + b against a naive loop, gradients, precision, shape errors, params, cost.
#include <doctest/doctest.h>

#include <map>
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


std::unique_ptr<op> linear_op(int N, bool bias = true) {
  return make_op("linear", attr_map({{"out", std::to_string(N)}, {"bias", bias ? "true" : "false"}}));
}

}  // namespace

TEST_CASE("ops/linear: forward matches a naive triple loop") {
  std::mt19937 rng(11);
  const int M = 6, K = 4, N = 5;
  auto o = linear_op(N);
  tensor x = random_f64({2, 3, K}, rng), w = random_f64({N, K}, rng), b = random_f64({N}, rng);
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {w, b}, &saved);
  REQUIRE(y.shape() == shape_t{2, 3, N});
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = b.f64()[n];
      for (int k = 0; k < K; ++k) want += x.f64()[m * K + k] * w.f64()[n * K + k];
      CHECK(y.f64()[m * N + n] == doctest::Approx(want).epsilon(1e-12));
    }
}

TEST_CASE("ops/linear: gradcheck with and without bias, any leading dims") {
  std::mt19937 rng(12);
  SUBCASE("bias, (B,T,C) input") {
    auto o = linear_op(5);
    auto r = gradcheck(*o, {random_f64({2, 3, 4}, rng)}, {random_f64({5, 4}, rng), random_f64({5}, rng)});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
  }
  SUBCASE("no bias, (B,T,C) input") {
    auto o = linear_op(3, false);
    auto r = gradcheck(*o, {random_f64({2, 3, 4}, rng)}, {random_f64({3, 4}, rng)});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
  }
  SUBCASE("rank-1 input") {
    auto o = linear_op(2);
    auto r = gradcheck(*o, {random_f64({4}, rng)}, {random_f64({2, 4}, rng), random_f64({2}, rng)});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
  }
}

TEST_CASE("ops/linear: f32 matches f64") {
  std::mt19937 rng(13);
  auto o = linear_op(5);
  CHECK(f32_vs_f64_forward(*o, {random_f64({2, 3, 4}, rng)}, {random_f64({5, 4}, rng), random_f64({5}, rng)}) <
        1e-5);
}

TEST_CASE("ops/linear: backward without an input gradient still fills the parameter gradients") {
  std::mt19937 rng(14);
  auto o = linear_op(3);
  tensor x = random_f64({2, 4}, rng), w = random_f64({3, 4}, rng), b = random_f64({3}, rng);
  tensor dy = random_f64({2, 3}, rng);
  const tensor* ins[] = {&x};
  const tensor* ps[] = {&w, &b};
  std::vector<tensor> saved;
  auto run = [&](bool want_dx) {
    tensor dx({2, 4}, dtype::f64), dw({3, 4}, dtype::f64), db({3}, dtype::f64);
    tensor* din[] = {want_dx ? &dx : nullptr};
    tensor* dps[] = {&dw, &db};
    o->backward({ins, ps, &dy, &saved, din, dps});
    return std::pair{dw, db};
  };
  auto [dw1, db1] = run(true);
  auto [dw0, db0] = run(false);
  CHECK(max_rel_diff(dw0, dw1) == 0);
  CHECK(max_rel_diff(db0, db1) == 0);
  for (int n = 0; n < 3; ++n) CHECK(db0.f64()[n] == doctest::Approx(dy.f64()[n] + dy.f64()[3 + n]));
}

TEST_CASE("ops/linear: shape, dtype and attribute errors") {
  auto o = make_op("linear", attr_map({{"out", "8"}, {"in", "256"}}));
  CHECK(infer(*o, {{2, 3, 256}}, {dtype::f32}) == shape_t{2, 3, 8});
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3, 128}}, {dtype::f32}),
                       doctest::Contains("linear: input last dimension 128 does not match attribute in=256"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{}}, {dtype::f32}), doctest::Contains("must have rank >= 1"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 256}}, {dtype::i32}), doctest::Contains("must be f32 or f64, got i32"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 256}, {2, 256}}, {dtype::f32, dtype::f32}), doctest::Contains("expects 1 input"),
                       op_error);
  CHECK_THROWS_WITH_AS(make_op("linear", attr_map()), doctest::Contains("linear: missing attribute 'out'"), op_error);
  CHECK_THROWS_WITH_AS(make_op("linear", attr_map({{"out", "4"}, {"bias", "maybe"}})),
                       doctest::Contains("'bias' must be true or false"), op_error);
  CHECK_THROWS_WITH_AS(make_op("linear", attr_map({{"out", "4"}, {"init_std", "-1"}})),
                       doctest::Contains("'init_std' must be >= 0"), op_error);
}

TEST_CASE("ops/linear: params follow the PyTorch layout and init_std") {
  std::vector<shape_t> in{{2, 3, 4}};
  auto ps = linear_op(5)->params(in);
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].shape == shape_t{5, 4});
  CHECK(ps[0].init == param_init::normal);
  CHECK(ps[0].stddev == doctest::Approx(0.02));
  CHECK(ps[0].decay);
  CHECK(ps[1].name == "bias");
  CHECK(ps[1].shape == shape_t{5});
  CHECK(ps[1].init == param_init::zeros);
  CHECK_FALSE(ps[1].decay);
  CHECK(linear_op(5, false)->params(in).size() == 1);
  auto scaled = make_op("linear", attr_map({{"out", "5"}, {"init_std", "0.005"}}))->params(in);
  CHECK(scaled[0].stddev == doctest::Approx(0.005));
}

TEST_CASE("ops/linear: cost is the analytic FLOP count") {
  std::vector<shape_t> in{{2, 3, 4}};
  const double M = 6, K = 4, N = 5;
  auto c = linear_op(5)->cost(in);
  CHECK(c.flops_forward == 2 * M * N * K + M * N);
  CHECK(c.flops_backward == 4 * M * N * K + M * N);
  CHECK(c.param_bytes == (N * K + N) * 4);
  CHECK(c.output_bytes == M * N * 4);
  auto nb = linear_op(5, false)->cost(in);
  CHECK(nb.flops_forward == 2 * M * N * K);
  CHECK(nb.flops_backward == 4 * M * N * K);
}
