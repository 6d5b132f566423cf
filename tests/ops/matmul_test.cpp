// matmul: batched products against a naive loop, gradients (both layouts of b), errors, cost.
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


std::unique_ptr<op> matmul_op(bool transpose_b) {
  return make_op("matmul", attr_map({{"transpose_b", transpose_b ? "true" : "false"}}));
}

}  // namespace

TEST_CASE("ops/matmul: forward matches a naive loop, both layouts of b") {
  std::mt19937 rng(21);
  const int Z = 3, M = 2, K = 4, N = 5;
  for (bool tb : {false, true}) {
    CAPTURE(tb);
    auto o = matmul_op(tb);
    tensor a = random_f64({Z, M, K}, rng);
    tensor b = random_f64(tb ? shape_t{Z, N, K} : shape_t{Z, K, N}, rng);
    std::vector<tensor> saved;
    tensor y = test::run_forward(*o, {a, b}, {}, &saved);
    REQUIRE(y.shape() == shape_t{Z, M, N});
    for (int z = 0; z < Z; ++z)
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double want = 0;
          for (int k = 0; k < K; ++k)
            want += a.f64()[(z * M + m) * K + k] * (tb ? b.f64()[(z * N + n) * K + k] : b.f64()[(z * K + k) * N + n]);
          CHECK(y.f64()[(z * M + m) * N + n] == doctest::Approx(want).epsilon(1e-12));
        }
  }
}

TEST_CASE("ops/matmul: gradcheck and f32 matches f64") {
  std::mt19937 rng(22);
  SUBCASE("(B,M,K) x (B,K,N)") {
    auto o = matmul_op(false);
    std::vector<tensor> in{random_f64({2, 3, 4}, rng), random_f64({2, 4, 5}, rng)};
    auto r = gradcheck(*o, in, {});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
    CHECK(f32_vs_f64_forward(*o, in, {}) < 1e-5);
  }
  SUBCASE("transpose_b: (B,NH,T,HS) x (B,NH,T,HS)^T") {
    auto o = matmul_op(true);
    std::vector<tensor> in{random_f64({2, 2, 3, 4}, rng), random_f64({2, 2, 3, 4}, rng)};
    auto r = gradcheck(*o, in, {});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
    CHECK(f32_vs_f64_forward(*o, in, {}) < 1e-5);
  }
  SUBCASE("plain rank-2 matrices") {
    auto o = matmul_op(false);
    auto r = gradcheck(*o, {random_f64({3, 2}, rng), random_f64({2, 4}, rng)}, {});
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
  }
}

TEST_CASE("ops/matmul: a null input gradient is skipped") {
  std::mt19937 rng(23);
  auto o = matmul_op(false);
  tensor a = random_f64({3, 2}, rng), b = random_f64({2, 4}, rng), dy = random_f64({3, 4}, rng);
  tensor db({2, 4}, dtype::f64);
  const tensor* ins[] = {&a, &b};
  tensor* din[] = {nullptr, &db};
  std::vector<tensor> saved;
  o->backward({ins, {}, &dy, &saved, din, {}});
  for (int k = 0; k < 2; ++k)
    for (int n = 0; n < 4; ++n) {
      double want = 0;
      for (int m = 0; m < 3; ++m) want += a.f64()[m * 2 + k] * dy.f64()[m * 4 + n];
      CHECK(db.f64()[k * 4 + n] == doctest::Approx(want).epsilon(1e-12));
    }
}

TEST_CASE("ops/matmul: shape and dtype errors") {
  auto o = matmul_op(false);
  auto ot = matmul_op(true);
  const std::vector<dtype> f32x2{dtype::f32, dtype::f32};
  CHECK(infer(*o, {{2, 3, 4}, {2, 4, 5}}, f32x2) == shape_t{2, 3, 5});
  CHECK(infer(*ot, {{2, 3, 4}, {2, 5, 4}}, f32x2) == shape_t{2, 3, 5});
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3, 4}, {2, 5, 4}}, f32x2), doctest::Contains("inner dimensions differ"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*ot, {{2, 3, 4}, {2, 4, 5}}, f32x2), doctest::Contains("inner dimensions differ"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3, 4}, {3, 4, 5}}, f32x2), doctest::Contains("leading batch dimensions differ"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3, 4}, {4, 5}}, f32x2), doctest::Contains("leading batch dimensions differ"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{4}, {4, 5}}, f32x2), doctest::Contains("input 0 must have rank >= 2"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{3, 4}, {4, 5}}, {dtype::f32, dtype::f64}), doctest::Contains("differ in element type"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{3, 4}, {4, 5}}, {dtype::f32, dtype::i32}),
                       doctest::Contains("input 1 must be f32 or f64"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{3, 4}}, {dtype::f32}), doctest::Contains("expects 2 inputs"), op_error);
  CHECK_THROWS_WITH_AS(make_op("matmul", attr_map({{"transpose_b", "yes"}})),
                       doctest::Contains("matmul: attribute 'transpose_b' must be true or false"), op_error);
}

TEST_CASE("ops/matmul: cost is the analytic FLOP count") {
  const double Z = 2 * 3, M = 4, K = 5, N = 7;
  auto c = matmul_op(false)->cost(std::vector<shape_t>{{2, 3, 4, 5}, {2, 3, 5, 7}});
  CHECK(c.flops_forward == 2 * Z * M * N * K);
  CHECK(c.flops_backward == 4 * Z * M * N * K);
  CHECK(c.output_bytes == Z * M * N * 4);
  CHECK(c.param_bytes == 0);
  auto ct = matmul_op(true)->cost(std::vector<shape_t>{{2, 3, 4, 5}, {2, 3, 7, 5}});
  CHECK(ct.flops_forward == 2 * Z * M * N * K);
}
