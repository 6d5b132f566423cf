// token_embedding and position_embedding: gradients, precision, shape errors, cost.
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
using fusion::test::random_ids;

namespace {


std::unique_ptr<op> token_op(int V, int C) {
  return make_op("token_embedding", attr_map({{"vocab", std::to_string(V)}, {"dim", std::to_string(C)}}));
}

std::unique_ptr<op> pos_op(int L) { return make_op("position_embedding", attr_map({{"max_len", std::to_string(L)}})); }

}  // namespace

TEST_CASE("ops/token_embedding: forward gathers the rows of the ids") {
  std::mt19937 rng(1);
  auto o = token_op(5, 4);
  tensor ids = tensor::from_i32({2, 3}, std::vector<int32_t>{0, 4, 2, 2, 1, 3});
  tensor w = random_f64({5, 4}, rng);
  std::vector<tensor> saved;
  tensor out = test::run_forward(*o, {ids}, {w}, &saved);
  REQUIRE(out.shape() == shape_t{2, 3, 4});
  for (int n = 0; n < 6; ++n)
    for (int c = 0; c < 4; ++c) CHECK(out.f64()[n * 4 + c] == w.f64()[ids.i32()[n] * 4 + c]);
}

TEST_CASE("ops/token_embedding: gradcheck and f32 matches f64") {
  std::mt19937 rng(2);
  auto o = token_op(5, 4);
  tensor ids = random_ids({2, 3}, 5, rng);
  ids.i32()[1] = ids.i32()[4];  // make sure one id repeats
  tensor w = random_f64({5, 4}, rng);
  auto r = gradcheck(*o, {ids}, {w});
  INFO(r.where);
  CHECK(r.max_error < 1e-6);
  CHECK(f32_vs_f64_forward(*o, {ids}, {w}) < 1e-5);
}

TEST_CASE("ops/token_embedding: a repeated id accumulates both rows' gradients") {
  auto o = token_op(3, 2);
  tensor ids = tensor::from_i32({1, 3}, std::vector<int32_t>{1, 1, 2});
  tensor w({3, 2}, dtype::f32);
  tensor dout = tensor::from({1, 3, 2}, std::vector<float>{1, 2, 10, 20, 100, 200});
  tensor dw({3, 2}, dtype::f32);
  dw.fill(0.5f);
  const tensor* ins[] = {&ids};
  const tensor* ps[] = {&w};
  tensor* din[] = {nullptr};
  tensor* dps[] = {&dw};
  std::vector<tensor> saved;
  o->backward({ins, ps, &dout, &saved, din, dps});
  CHECK(dw.f32()[0] == 0.5f);  // id 0 never used
  CHECK(dw.f32()[1] == 0.5f);
  CHECK(dw.f32()[2] == 0.5f + 1 + 10);
  CHECK(dw.f32()[3] == 0.5f + 2 + 20);
  CHECK(dw.f32()[4] == 0.5f + 100);
  CHECK(dw.f32()[5] == 0.5f + 200);
}

TEST_CASE("ops/token_embedding: out-of-range token id throws") {
  auto o = token_op(5, 4);
  tensor w({5, 4}, dtype::f32);
  for (int32_t bad : {5, -1, 1 << 30}) {
    tensor ids = tensor::from_i32({1, 2}, std::vector<int32_t>{0, bad});
    tensor out({1, 2, 4}, dtype::f32);
    const tensor* ins[] = {&ids};
    const tensor* ps[] = {&w};
    std::vector<tensor> saved;
    CHECK_THROWS_WITH_AS(o->forward({ins, ps, &out, &saved}),
                         doctest::Contains(("token id " + std::to_string(bad) + " at position 1 is out of range").c_str()),
                         op_error);
    tensor dw({5, 4}, dtype::f32);
    tensor* din[] = {nullptr};
    tensor* dps[] = {&dw};
    CHECK_THROWS_AS(o->backward({ins, ps, &out, &saved, din, dps}), op_error);
  }
}

TEST_CASE("ops/token_embedding: shape, dtype and attribute errors") {
  auto o = token_op(5, 4);
  CHECK(infer(*o, {{2, 3}}, {dtype::i32}) == shape_t{2, 3, 4});
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3, 4}}, {dtype::i32}), doctest::Contains("must have rank 2"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}}, {dtype::f32}), doctest::Contains("must be i32"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 3}, {2, 3}}, {dtype::i32, dtype::i32}), doctest::Contains("expects 1 input"),
                       op_error);
  CHECK_THROWS_WITH_AS(make_op("token_embedding", attr_map({{"dim", "4"}})),
                       doctest::Contains("token_embedding: missing attribute 'vocab'"), op_error);
  CHECK_THROWS_WITH_AS(make_op("token_embedding", attr_map({{"vocab", "5"}, {"dim", "0"}})),
                       doctest::Contains("'dim' must be positive"), op_error);
  CHECK_FALSE(o->input_has_grad(0));
}

TEST_CASE("ops/token_embedding: params and cost") {
  auto o = token_op(50, 8);
  std::vector<shape_t> in{{2, 3}};
  auto ps = o->params(in);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].shape == shape_t{50, 8});
  CHECK(ps[0].init == param_init::normal);
  CHECK(ps[0].stddev == doctest::Approx(0.02));
  CHECK(ps[0].decay);
  auto c = o->cost(in);
  CHECK(c.flops_forward == 0);
  CHECK(c.flops_backward == 2 * 3 * 8);
  CHECK(c.param_bytes == 50 * 8 * 4);
  CHECK(c.output_bytes == 2 * 3 * 8 * 4);
}

TEST_CASE("ops/position_embedding: forward adds the row of each position") {
  std::mt19937 rng(3);
  auto o = pos_op(5);
  tensor x = random_f64({2, 3, 4}, rng);
  tensor w = random_f64({5, 4}, rng);
  std::vector<tensor> saved;
  tensor out = test::run_forward(*o, {x}, {w}, &saved);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 3; ++t)
      for (int c = 0; c < 4; ++c) {
        int i = (b * 3 + t) * 4 + c;
        CHECK(out.f64()[i] == doctest::Approx(x.f64()[i] + w.f64()[t * 4 + c]));
      }
}

TEST_CASE("ops/position_embedding: gradcheck and f32 matches f64") {
  std::mt19937 rng(4);
  auto o = pos_op(5);
  tensor x = random_f64({2, 3, 4}, rng);
  tensor w = random_f64({5, 4}, rng);
  auto r = gradcheck(*o, {x}, {w});
  INFO(r.where);
  CHECK(r.max_error < 1e-6);
  CHECK(f32_vs_f64_forward(*o, {x}, {w}) < 1e-5);
}

TEST_CASE("ops/position_embedding: shape, dtype and attribute errors") {
  auto o = pos_op(4);
  CHECK(infer(*o, {{2, 4, 8}}, {dtype::f32}) == shape_t{2, 4, 8});
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 5, 8}}, {dtype::f32}),
                       doctest::Contains("sequence length T=5 exceeds attribute max_len=4"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 4}}, {dtype::f32}), doctest::Contains("must have rank 3"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{2, 4, 8}}, {dtype::i32}), doctest::Contains("must be f32 or f64"), op_error);
  auto od = make_op("position_embedding", attr_map({{"max_len", "4"}, {"dim", "6"}}));
  CHECK_THROWS_WITH_AS(infer(*od, {{2, 4, 8}}, {dtype::f32}),
                       doctest::Contains("input last dimension 8 does not match attribute dim=6"), op_error);
  CHECK_THROWS_WITH_AS(make_op("position_embedding", attr_map()),
                       doctest::Contains("missing attribute 'max_len'"), op_error);
}

TEST_CASE("ops/position_embedding: params and cost") {
  auto o = pos_op(16);
  std::vector<shape_t> in{{2, 3, 4}};
  auto ps = o->params(in);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].shape == shape_t{16, 4});
  CHECK(ps[0].init == param_init::normal);
  CHECK(ps[0].stddev == doctest::Approx(0.01));
  CHECK(ps[0].decay);
  auto c = o->cost(in);
  CHECK(c.flops_forward == 2 * 3 * 4);
  CHECK(c.flops_backward == 2 * (2 * 3 * 4));
  CHECK(c.param_bytes == 16 * 4 * 4);
}
