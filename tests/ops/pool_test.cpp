// Pooling and flatten: gradients by finite differences, max-pool tie and NaN rules, padding
// semantics (-infinity for max, zeros counted for avg), NaN-poisoned outputs, shape errors and
// cost. Shapes: B batch, C channels, H x W pixels.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::gradcheck;
using fusion::test::random_f64;

namespace {

std::unique_ptr<op> make_pool(const std::string& kind, int k, int s = 0, int p = -1) {
  attr_map a;
  a.set("kernel", std::to_string(k));
  if (s > 0) a.set("stride", std::to_string(s));
  if (p >= 0) a.set("padding", std::to_string(p));
  return make_op(kind, a);
}

shape_t infer(const op& o, shape_t s, dtype t = dtype::f32) {
  std::vector<shape_t> shapes{std::move(s)};
  std::vector<dtype> types{t};
  return o.infer_shape(shapes, types);
}

/// din from one backward call of a parameter-free op, starting from zero.
tensor input_grad(const op& o, const tensor& x, const tensor& dy, const std::vector<tensor>& saved) {
  tensor dx(x.shape(), dtype::f64);
  const test::backward_inputs ins(o, std::vector<const tensor*>{&x});
  tensor* dins[] = {&dx};
  o.backward({ins.ptrs, {}, &dy, &saved, dins, {}});
  return dx;
}

tensor f64_from(shape_t s, std::initializer_list<double> v) {
  tensor t(std::move(s), dtype::f64);
  std::copy(v.begin(), v.end(), t.f64());
  return t;
}

}  // namespace

TEST_CASE("ops/max_pool2d: gradcheck with overlapping windows (stride < kernel) and padding") {
  auto o = make_pool("max_pool2d", 3, 2, 1);
  std::mt19937 rng(1);
  CHECK(infer(*o, {2, 2, 5, 6}) == shape_t{2, 2, 3, 3});
  auto res = gradcheck(*o, {random_f64({2, 2, 5, 6}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/avg_pool2d: gradcheck with padding and overlapping windows") {
  auto o = make_pool("avg_pool2d", 3, 2, 1);
  std::mt19937 rng(2);
  auto res = gradcheck(*o, {random_f64({2, 3, 5, 4}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/global_avg_pool and flatten: gradcheck") {
  std::mt19937 rng(3);
  auto g = make_op("global_avg_pool", {});
  auto res = gradcheck(*g, {random_f64({2, 3, 4, 5}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
  auto f = make_op("flatten", {});
  res = gradcheck(*f, {random_f64({2, 3, 2, 2}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/max_pool2d: ties send the gradient to the first maximum in row-major order only") {
  auto o = make_pool("max_pool2d", 2, 1);  // 3x3 -> 2x2, overlapping windows
  // Window (0,0) = {1, 3, 3, 3}: first max at flat index 1. Window (0,1) = {3, 2, 3, 3}: index 1
  // again. Window (1,0) = {3, 3, 0, 3}: index 3. Window (1,1) = {3, 3, 3, 3}: index 4.
  tensor x = f64_from({1, 1, 3, 3}, {1, 3, 2,  //
                                     3, 3, 3,  //
                                     0, 3, 3});
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {}, &saved);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].type() == dtype::i32);
  const int32_t want_idx[] = {1, 1, 3, 4};
  for (int i = 0; i < 4; ++i) {
    CHECK(y.f64()[i] == 3.0);
    CHECK(saved[0].i32()[i] == want_idx[i]);
  }
  tensor dy = f64_from({1, 1, 2, 2}, {1, 10, 100, 1000});
  tensor dx = input_grad(*o, x, dy, saved);
  const double want[] = {0, 11, 0, 100, 1000, 0, 0, 0, 0};
  for (int i = 0; i < 9; ++i) CHECK(dx.f64()[i] == want[i]);
}

TEST_CASE("ops/max_pool2d: padding counts as -infinity and a NaN wins its window") {
  auto o = make_pool("max_pool2d", 3, 3, 1);  // 2x2 -> 1x1, the window is mostly padding
  tensor x = f64_from({1, 1, 2, 2}, {-4, -2, -3, -5});
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {}, &saved);
  CHECK(y.f64()[0] == -2.0);
  CHECK(saved[0].i32()[0] == 1);
  // All -infinity: the first real pixel, never a padding cell.
  const double inf = std::numeric_limits<double>::infinity();
  x = f64_from({1, 1, 2, 2}, {-inf, -inf, -inf, -inf});
  y = test::run_forward(*o, {x}, {}, &saved);
  CHECK(y.f64()[0] == -inf);
  CHECK(saved[0].i32()[0] == 0);
  x = f64_from({1, 1, 2, 2}, {1, std::nan(""), 7, std::nan("")});
  int64_t unwritten = 0;
  y = test::forward_poisoned(*o, {x}, {}, &saved, dtype::f64, unwritten);
  CHECK(std::isnan(y.f64()[0]));
  CHECK(saved[0].i32()[0] == 1);
}

TEST_CASE("ops/avg_pool2d: divides by kernel * kernel, padding included") {
  auto o = make_pool("avg_pool2d", 3, 2, 1);  // 3x3 -> 2x2
  tensor x = f64_from({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<tensor> saved;
  tensor y = test::run_forward(*o, {x}, {}, &saved);
  CHECK(y.f64()[0] == doctest::Approx((1 + 2 + 4 + 5) / 9.0).epsilon(1e-14));
  CHECK(y.f64()[1] == doctest::Approx((2 + 3 + 5 + 6) / 9.0).epsilon(1e-14));
  CHECK(y.f64()[3] == doctest::Approx((5 + 6 + 8 + 9) / 9.0).epsilon(1e-14));
  tensor dy = f64_from({1, 1, 2, 2}, {9, 9, 9, 9});
  tensor dx = input_grad(*o, x, dy, saved);
  const double want[] = {1, 2, 1, 2, 4, 2, 1, 2, 1};  // how many windows cover each pixel
  for (int i = 0; i < 9; ++i) CHECK(dx.f64()[i] == doctest::Approx(want[i]).epsilon(1e-14));
}

TEST_CASE("ops/global_avg_pool and flatten: values and shapes") {
  auto g = make_op("global_avg_pool", {});
  tensor x = f64_from({1, 2, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  std::vector<tensor> saved;
  tensor y = test::run_forward(*g, {x}, {}, &saved);
  CHECK(y.shape() == shape_t{1, 2});
  CHECK(y.f64()[0] == 2.5);
  CHECK(y.f64()[1] == 25.0);
  auto f = make_op("flatten", {});
  CHECK(infer(*f, {4, 3, 5, 2}) == shape_t{4, 30});
  CHECK(infer(*f, {4, 3}) == shape_t{4, 3});
  y = test::run_forward(*f, {x}, {}, &saved);
  CHECK(y.shape() == shape_t{1, 8});
  for (int i = 0; i < 8; ++i) CHECK(y.f64()[i] == x.f64()[i]);
}

TEST_CASE("ops/pool: f32 forward matches f64 and writes every output element") {
  std::mt19937 rng(4);
  tensor x = random_f64({2, 3, 7, 6}, rng, 2.0);
  for (auto& o : {make_pool("max_pool2d", 3, 2, 1), make_pool("avg_pool2d", 2), make_pool("max_pool2d", 2),
                  make_op("global_avg_pool", {}), make_op("flatten", {})}) {
    INFO(o->kind());
    CHECK(test::f32_vs_f64_forward(*o, {x}, {}) < 1e-6);
  }
}

TEST_CASE("ops/pool: bad attributes and shapes throw op_error naming the problem") {
  CHECK_THROWS_WITH_AS(make_op("max_pool2d", {}), doctest::Contains("kernel"), op_error);
  CHECK_THROWS_WITH_AS(make_pool("max_pool2d", 0), doctest::Contains("kernel"), op_error);
  CHECK_THROWS_WITH_AS(make_op("avg_pool2d", {{"kernel", "2"}, {"stride", "0"}}), doctest::Contains("stride"),
                       op_error);
  CHECK_THROWS_WITH_AS(make_pool("avg_pool2d", 3, 1, 2), doctest::Contains("padding"), op_error);
  CHECK_THROWS_WITH_AS(make_pool("max_pool2d", 2, 1, 2), doctest::Contains("[0, 1]"), op_error);
  // A kernel near 2^63 with padding near 2^62 overflowed H + 2 * padding (found by
  // tests/fuzz/fuzz_model.cpp; seed tests/fuzz/corpus/model/pool-huge-padding.pbtxt).
  CHECK_THROWS_WITH_AS(make_op("max_pool2d", {{"kernel", "9223372036854775807"}, {"padding", "4611686018427387903"}}),
                       doctest::Contains("attribute 'kernel' is 9223372036854775807, more than the limit of 2^31"),
                       op_error);
  CHECK_THROWS_WITH_AS(make_op("avg_pool2d", {{"kernel", "2"}, {"stride", "2147483649"}}),
                       doctest::Contains("attribute 'stride' is 2147483649"), op_error);
  auto o = make_pool("max_pool2d", 3);
  CHECK(infer(*o, {2, 3, 7, 8}) == shape_t{2, 3, 2, 2});  // stride defaults to the kernel
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 8}), doctest::Contains("rank 4"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 0, 8, 8}), doctest::Contains("non-positive"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 2, 8}), doctest::Contains("smaller than the kernel 3"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 8, 8}, dtype::i32), doctest::Contains("i32"), op_error);
  auto g = make_op("global_avg_pool", {});
  CHECK_THROWS_WITH_AS(infer(*g, {2, 3}), doctest::Contains("rank 4"), op_error);
  CHECK_THROWS_WITH_AS(infer(*g, {2, 3, 0, 1}), doctest::Contains("non-positive"), op_error);
  auto f = make_op("flatten", {});
  CHECK_THROWS_WITH_AS(infer(*f, {6}), doctest::Contains("rank >= 2"), op_error);
  CHECK_THROWS_WITH_AS(infer(*f, {6, 0}), doctest::Contains("non-positive"), op_error);
  // Backward of max pool without forward's argmax.
  tensor x({1, 1, 3, 3}, dtype::f64), dy({1, 1, 1, 1}, dtype::f64);
  CHECK_THROWS_WITH_AS(input_grad(*o, x, dy, {}), doctest::Contains("argmax"), op_error);
}

TEST_CASE("ops/pool: cost counts window work per output") {
  std::vector<shape_t> in{{2, 4, 8, 8}};
  const double n_in = 2.0 * 4 * 64, n_out = 2.0 * 4 * 16;
  op_cost m = make_pool("max_pool2d", 2)->cost(in);
  CHECK(m.flops_forward == 4 * n_out);
  CHECK(m.flops_backward == n_out);
  CHECK(m.output_bytes == n_out * 4);
  CHECK(m.param_bytes == 0);
  op_cost a = make_pool("avg_pool2d", 2)->cost(in);
  CHECK(a.flops_forward == 5 * n_out);
  CHECK(a.bytes_forward == (n_in + n_out) * 4);
  op_cost g = make_op("global_avg_pool", {})->cost(in);
  CHECK(g.flops_forward == n_in + 8);
  CHECK(g.output_bytes == 8 * 4);
  op_cost f = make_op("flatten", {})->cost(in);
  CHECK(f.flops_forward == 0);
  CHECK(f.output_bytes == n_in * 4);
}
