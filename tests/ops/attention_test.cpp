// Causal multi-head attention: gradients by finite differences, a naive reference forward, the
// causal mask, f32/f64 agreement, shape errors and cost.
// Shapes: B batch, T time, C channels, NH heads, HS = C / NH; qkv (B, T, 3C), out (B, T, C).
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::gradcheck;
using fusion::test::random_f64;

namespace {

std::unique_ptr<op> make_attention(int64_t heads, bool causal = true) {
  attr_map a;
  a.set("heads", std::to_string(heads));
  a.set("causal", causal ? "true" : "false");
  return make_op("attention", a);
}

shape_t infer(const op& o, shape_t s, dtype t = dtype::f32) {
  std::vector<shape_t> shapes{std::move(s)};
  std::vector<dtype> types{t};
  return o.infer_shape(shapes, types);
}

// Straightforward triple loop, written independently of the GEMM-based kernel.
tensor reference_attention(const tensor& qkv, int64_t NH, bool causal) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, HS = C / NH;
  tensor out({B, T, C}, dtype::f64);
  const double* x = qkv.f64();
  auto at = [&](int64_t b, int64_t t, int64_t col) { return x[(b * T + t) * 3 * C + col]; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = causal ? t + 1 : T;
        std::vector<double> w(n);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t d = 0; d < HS; ++d) s += at(b, t, h * HS + d) * at(b, j, C + h * HS + d);
          w[j] = s / std::sqrt(double(HS));
          mx = std::max(mx, w[j]);
        }
        for (auto& v : w) sum += (v = std::exp(v - mx));
        for (int64_t d = 0; d < HS; ++d) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += w[j] / sum * at(b, j, 2 * C + h * HS + d);
          out.f64()[(b * T + t) * C + h * HS + d] = o;
        }
      }
  return out;
}

}  // namespace

TEST_CASE("ops/attention: gradcheck causal, B=2 T=3 C=4 NH=2") {
  auto o = make_attention(2);
  std::mt19937 rng(1);
  auto res = gradcheck(*o, {random_f64({2, 3, 12}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/attention: gradcheck non-causal, B=2 T=3 C=4 NH=2") {
  auto o = make_attention(2, false);
  std::mt19937 rng(2);
  auto res = gradcheck(*o, {random_f64({2, 3, 12}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/attention: gradcheck causal over several query-row blocks (T=70)") {
  auto o = make_attention(2);
  std::mt19937 rng(3);
  auto res = gradcheck(*o, {random_f64({1, 70, 6}, rng)}, {});
  INFO(res.where);
  CHECK(res.max_error < 1e-6);
}

TEST_CASE("ops/attention: forward matches a naive reference, causal and not") {
  std::mt19937 rng(4);
  for (bool causal : {true, false})
    for (int64_t T : {1, 5, 67, 130}) {
      CAPTURE(causal);
      CAPTURE(T);
      const int64_t B = 2, NH = 3, C = 6;
      auto o = make_attention(NH, causal);
      tensor qkv = random_f64({B, T, 3 * C}, rng, 2.0);
      std::vector<tensor> saved;
      tensor y = test::run_forward(*o, {qkv}, {}, &saved);
      CHECK(max_rel_diff(y, reference_attention(qkv, NH, causal)) < 1e-12);
      REQUIRE(saved.size() == 1);
      CHECK(saved[0].shape() == shape_t{B, NH, T, T});
      // Every probability row sums to 1, and with the mask no position sees the future.
      for (int64_t r = 0; r < B * NH * T; ++r) {
        const double* p = saved[0].f64() + r * T;
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) sum += p[j];
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
        if (causal)
          for (int64_t j = r % T + 1; j < T; ++j) CHECK(p[j] == 0.0);
      }
    }
}

TEST_CASE("ops/attention: causal mask, early outputs ignore later keys and values") {
  const int64_t B = 2, T = 5, C = 4, NH = 2;
  auto o = make_attention(NH);
  std::mt19937 rng(5);
  tensor qkv = random_f64({B, T, 3 * C}, rng);
  std::vector<tensor> saved;
  tensor y0 = test::run_forward(*o, {qkv}, {}, &saved);

  // Changing k and v at t > 0 leaves out[:, 0, :] unchanged (and does change later outputs).
  tensor qkv2 = qkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t)
      for (int64_t c = C; c < 3 * C; ++c) qkv2.f64()[(b * T + t) * 3 * C + c] += 0.5;
  std::vector<tensor> saved2;
  tensor y1 = test::run_forward(*o, {qkv2}, {}, &saved2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) CHECK(y1.f64()[b * T * C + c] == y0.f64()[b * T * C + c]);
  CHECK(max_rel_diff(y1, y0) > 1e-3);

  // The gradient of out[:, 0, :] w.r.t. any input at t > 0 is exactly zero.
  tensor dy({B, T, C}, dtype::f64), dqkv({B, T, 3 * C}, dtype::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) dy.f64()[b * T * C + c] = 1.0 + c;
  const tensor* ins[] = {&qkv};
  tensor* din[] = {&dqkv};
  o->backward({ins, {}, &dy, &saved, din, {}});
  double early = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < 3 * C; ++c) early += std::abs(dqkv.f64()[b * T * 3 * C + c]);
    for (int64_t t = 1; t < T; ++t)
      for (int64_t c = 0; c < 3 * C; ++c) CHECK(dqkv.f64()[(b * T + t) * 3 * C + c] == 0.0);
  }
  CHECK(early > 0);
}

TEST_CASE("ops/attention: f32 forward matches f64") {
  std::mt19937 rng(6);
  for (bool causal : {true, false}) {
    auto o = make_attention(4, causal);
    double d = test::f32_vs_f64_forward(*o, {random_f64({2, 9, 3 * 16}, rng)}, {});
    CHECK(d < 1e-5);
  }
}

TEST_CASE("ops/attention: bad attributes and shapes throw op_error naming the problem") {
  CHECK_THROWS_WITH_AS(make_op("attention", attr_map{}), doctest::Contains("heads"), op_error);
  CHECK_THROWS_WITH_AS(make_attention(0), doctest::Contains("heads"), op_error);
  auto o = make_attention(2);
  CHECK(infer(*o, {2, 3, 12}) == shape_t{2, 3, 4});
  CHECK(o->params(std::vector<shape_t>{{2, 3, 12}}).empty());
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 13}), doctest::Contains("divisible by 3"), op_error);
  CHECK_THROWS_WITH_AS(infer(*make_attention(3), {2, 3, 12}), doctest::Contains("divisible by heads"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {3, 12}), doctest::Contains("(B, T, 3C)"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 0, 12}), doctest::Contains("non-positive"), op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {2, 3, 12}, dtype::i32), doctest::Contains("i32"), op_error);
  // A forward whose qkv dtype differs from the output's is refused, not misread.
  std::mt19937 rng(7);
  tensor qkv = random_f64({2, 3, 12}, rng), out({2, 3, 4}, dtype::f32);
  std::vector<tensor> saved;
  const tensor* ins[] = {&qkv};
  CHECK_THROWS_WITH_AS(o->forward({ins, {}, &out, &saved}), doctest::Contains("qkv has dtype f64"), op_error);
}

TEST_CASE("ops/attention: cost follows the analytic formula") {
  const double B = 4, T = 128, C = 256, NH = 4, HS = C / NH;
  std::vector<shape_t> in{{4, 128, 3 * 256}};
  op_cost causal = make_attention(4, true)->cost(in);
  const double pairs = T * (T + 1) / 2;
  CHECK(causal.flops_forward == B * NH * pairs * (4 * HS + 5));
  CHECK(causal.flops_backward == B * NH * pairs * (8 * HS + 4));
  CHECK(causal.output_bytes == B * T * C * 4);
  CHECK(causal.param_bytes == 0);
  op_cost full = make_attention(4, false)->cost(in);
  CHECK(full.flops_forward == B * NH * T * T * (4 * HS + 5));
}
