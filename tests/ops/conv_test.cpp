// conv2d: forward against a naive direct convolution, gradients by finite differences (stride,
// padding, dilation, groups, depthwise, bias on/off, the 1x1 fast path, several images per gemm),
// NaN-poisoned outputs, shape and attribute errors, params and cost.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"

using namespace fusion;
using fusion::test::f32_vs_f64_forward;
using fusion::test::gradcheck;
using fusion::test::infer;
using fusion::test::random_f64;

namespace {

struct conv_cfg {
  int out, k, stride = 1, pad = 0, dil = 1, groups = 1;
  bool bias = true;
};

std::unique_ptr<op> conv_op(const conv_cfg& c) {
  return make_op("conv2d", attr_map({{"out", std::to_string(c.out)},
                                     {"kernel", std::to_string(c.k)},
                                     {"stride", std::to_string(c.stride)},
                                     {"padding", std::to_string(c.pad)},
                                     {"dilation", std::to_string(c.dil)},
                                     {"groups", std::to_string(c.groups)},
                                     {"bias", c.bias ? "true" : "false"}}));
}

// The definition: out[b,o,i,j] = bias[o] + sum over c in o's group, ki, kj of
// in[b, c, i s - p + ki d, j s - p + kj d] w[o, c - group start, ki, kj], outside pixels zero.
tensor naive_conv(const tensor& x, const tensor& w, const tensor* b, const conv_cfg& c) {
  const int64_t B = x.dim(0), Cin = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t Ho = (H + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
  const int64_t Wo = (W + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
  const int64_t cin_g = Cin / c.groups, cout_g = c.out / c.groups;
  tensor y({B, c.out, Ho, Wo}, dtype::f64);
  for (int64_t n = 0; n < B; ++n)
    for (int64_t o = 0; o < c.out; ++o)
      for (int64_t i = 0; i < Ho; ++i)
        for (int64_t j = 0; j < Wo; ++j) {
          double acc = b ? b->f64()[o] : 0.0;
          const int64_t g = o / cout_g;
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t ki = 0; ki < c.k; ++ki)
              for (int64_t kj = 0; kj < c.k; ++kj) {
                const int64_t ih = i * c.stride - c.pad + ki * c.dil, iw = j * c.stride - c.pad + kj * c.dil;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x.f64()[((n * Cin + g * cin_g + ci) * H + ih) * W + iw] *
                       w.f64()[((o * cin_g + ci) * c.k + ki) * c.k + kj];
              }
          y.f64()[((n * c.out + o) * Ho + i) * Wo + j] = acc;
        }
  return y;
}

std::vector<tensor> random_params(const op& o, const shape_t& in, std::mt19937& rng) {
  std::vector<shape_t> shapes{in};
  std::vector<tensor> ps;
  for (auto& p : o.params(shapes)) ps.push_back(random_f64(p.shape, rng));
  return ps;
}

}  // namespace

TEST_CASE("ops/conv2d: forward matches a naive direct convolution") {
  std::mt19937 rng(21);
  struct named {
    const char* name;
    conv_cfg c;
    shape_t in;
  };
  // Images share a gemm until it is 256 columns wide (ops/cpu/conv.cpp): small images with
  // B > 1 take that path (8x8 outputs: 4 images per gemm, then the rest), B = 1 or >= 256
  // outputs per image the in-place one, and a 1x1 stride-1 unpadded conv there skips im2col.
  // im2col copies row segments for outputs at least 8 wide and gathers through an offset
  // table for narrower ones; both are covered with strides, padding and dilation.
  const named cases[] = {
      {"3x3 pad 1", {5, 3, 1, 1}, {2, 3, 6, 7}},
      {"stride 2 pad 1, no bias", {4, 3, 2, 1, 1, 1, false}, {2, 3, 7, 6}},
      {"dilation 2 pad 2", {3, 3, 1, 2, 2}, {1, 2, 8, 8}},
      {"groups 2", {4, 3, 1, 1, 1, 2}, {2, 6, 5, 5}},
      {"depthwise", {4, 3, 1, 1, 1, 4}, {3, 4, 5, 4}},
      {"1x1 fast path", {6, 1}, {1, 4, 5, 5}},
      {"1x1 fast path, batch, groups 2", {4, 1, 1, 0, 1, 2}, {2, 4, 16, 17}},
      {"1x1 batched", {6, 1}, {3, 4, 5, 5}},
      {"3x3 pad 1, one image per gemm", {3, 3, 1, 1}, {3, 2, 16, 16}},
      {"1x1 stride 2", {3, 1, 2}, {2, 4, 5, 5}},
      {"pad larger than kernel reach", {2, 2, 3, 3}, {2, 1, 3, 4}},
      {"images per gemm 4 + 1", {3, 3, 1, 1}, {5, 2, 8, 8}},
      {"stride 2 pad 1, wide outputs (row copies)", {3, 3, 2, 1}, {2, 2, 17, 18}},
      {"dilation 2 pad 1, narrow outputs (offset table)", {3, 3, 1, 1, 2}, {3, 2, 6, 7}},
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.name);
    auto o = conv_op(tc.c);
    tensor x = random_f64(tc.in, rng);
    auto ps = random_params(*o, tc.in, rng);
    std::vector<tensor> saved;
    tensor y = test::run_forward(*o, {x}, ps, &saved);
    tensor want = naive_conv(x, ps[0], tc.c.bias ? &ps[1] : nullptr, tc.c);
    REQUIRE(y.shape() == want.shape());
    CHECK(max_rel_diff(y, want) < 1e-12);
    CHECK(f32_vs_f64_forward(*o, {x}, ps) < 1e-5);
  }
}

TEST_CASE("ops/conv2d: forward writes every output element in f32 (NaN-poisoned output)") {
  std::mt19937 rng(22);
  for (bool bias : {true, false})
    for (int64_t batch : {1, 9}) {  // one image in place; several through the shared gemm
      CAPTURE(bias);
      CAPTURE(batch);
      auto o = conv_op({4, 3, 2, 1, 1, 1, bias});
      tensor x = random_f64({batch, 2, 5, 5}, rng).to(dtype::f32);
      std::vector<tensor> ps;
      for (auto& p : random_params(*o, x.shape(), rng)) ps.push_back(p.to(dtype::f32));
      std::vector<tensor> saved;
      int64_t unwritten = -1;
      test::forward_poisoned(*o, {x}, ps, &saved, dtype::f32, unwritten);
      CHECK(unwritten == 0);
    }
}

TEST_CASE("ops/conv2d: gradcheck against finite differences") {
  std::mt19937 rng(23);
  struct named {
    const char* name;
    conv_cfg c;
    shape_t in;
  };
  const named cases[] = {
      {"stride 2, padding 1", {3, 3, 2, 1}, {2, 2, 5, 6}},
      {"dilation 2, padding 2, no bias", {2, 3, 1, 2, 2, 1, false}, {1, 2, 6, 6}},
      {"groups 2", {4, 3, 1, 1, 1, 2}, {2, 4, 4, 4}},
      {"depthwise (groups = Cin)", {3, 3, 1, 1, 1, 3}, {2, 3, 4, 5}},
      {"1x1 fast path", {3, 1}, {1, 4, 3, 3}},
      {"1x1 batched", {3, 1}, {2, 4, 3, 3}},
      {"3x3 pad 1, one image per gemm, batch 2", {2, 3, 1, 1}, {2, 1, 16, 16}},
      {"1x1 fast path, groups 2, no bias", {4, 1, 1, 0, 1, 2, false}, {1, 4, 3, 2}},
      {"images per gemm 4 + 2", {2, 3, 1, 1}, {6, 1, 8, 8}},
      {"stride 2, padding 1, wide outputs (row copies)", {2, 3, 2, 1}, {1, 1, 17, 16}},
      {"1x1 batched, groups 2 (pointwise copies)", {4, 1, 1, 0, 1, 2}, {3, 4, 3, 3}},
  };
  for (const auto& tc : cases) {
    CAPTURE(tc.name);
    auto o = conv_op(tc.c);
    auto r = gradcheck(*o, {random_f64(tc.in, rng)}, random_params(*o, tc.in, rng));
    INFO(r.where);
    CHECK(r.max_error < 1e-6);
  }
}

TEST_CASE("ops/conv2d: backward with only some gradients wanted") {
  std::mt19937 rng(24);
  for (int k : {1, 3})
    for (int64_t B : {1, 2}) {  // B = 1, k = 1: the fast path
    CAPTURE(k);
    CAPTURE(B);
    auto o = conv_op({3, k, 1, k / 2});
    tensor x = random_f64({B, 2, 4, 4}, rng), w = random_f64({3, 2, k, k}, rng), b = random_f64({3}, rng);
    tensor dy = random_f64({B, 3, 4, 4}, rng);
    const tensor* ins[] = {&x};
    const tensor* ps[] = {&w, &b};
    std::vector<tensor> saved;
    auto run = [&](bool want_dx, bool want_dw) {
      tensor dx({B, 2, 4, 4}, dtype::f64), dw({3, 2, k, k}, dtype::f64), db({3}, dtype::f64);
      tensor* din[] = {want_dx ? &dx : nullptr};
      tensor* dps[] = {want_dw ? &dw : nullptr, &db};
      o->backward({ins, ps, &dy, &saved, din, dps});
      return std::vector<tensor>{dx, dw, db};
    };
    auto all = run(true, true), no_dx = run(false, true), no_dw = run(true, false);
    CHECK(max_rel_diff(all[1], no_dx[1]) == 0);
    CHECK(max_rel_diff(all[0], no_dw[0]) == 0);
    CHECK(max_rel_diff(all[2], no_dw[2]) == 0);
    for (int c = 0; c < 3; ++c) {
      double want = 0;
      for (int n = 0; n < B; ++n)
        for (int i = 0; i < 16; ++i) want += dy.f64()[(n * 3 + c) * 16 + i];
      CHECK(all[2].f64()[c] == doctest::Approx(want).epsilon(1e-12));
    }
  }
}

TEST_CASE("ops/conv2d: shape, dtype and attribute errors") {
  auto o = conv_op({8, 3, 2, 1});
  CHECK(infer(*o, {{4, 3, 28, 28}}, {dtype::f32}) == shape_t{4, 8, 14, 14});
  CHECK(infer(*o, {{4, 3, 1, 1}}, {dtype::f32}) == shape_t{4, 8, 1, 1});
  CHECK_THROWS_WITH_AS(infer(*o, {{4, 3, 28}}, {dtype::f32}), doctest::Contains("must have rank 4 (B, Cin, H, W)"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{4, 3, 8, 8}}, {dtype::i32}), doctest::Contains("must be f32 or f64, got i32"),
                       op_error);
  CHECK_THROWS_WITH_AS(infer(*o, {{4, 0, 8, 8}}, {dtype::f32}), doctest::Contains("has no channels"), op_error);
  // Output too small: the dilated kernel does not fit into the padded input.
  auto big = conv_op({2, 5});
  CHECK_THROWS_WITH_AS(infer(*big, {{1, 1, 4, 9}}, {dtype::f32}),
                       doctest::Contains("conv2d: input of 4x9 pixels is too small for kernel 5"), op_error);
  CHECK_THROWS_WITH_AS(infer(*big, {{1, 1, 4, 9}}, {dtype::f32}), doctest::Contains("output would be 0x5"), op_error);
  // (2 - 3) / 2 truncates to 0 in C++: the size formula must not report one output here.
  CHECK_THROWS_AS(infer(*conv_op({2, 3, 2}), {{1, 1, 2, 2}}, {dtype::f32}), op_error);
  CHECK_THROWS_AS(infer(*conv_op({2, 2, 1, 0, 3}), {{1, 1, 3, 8}}, {dtype::f32}), op_error);
  // Groups must divide both channel counts.
  auto grouped = conv_op({4, 3, 1, 1, 1, 2});
  CHECK(infer(*grouped, {{1, 6, 4, 4}}, {dtype::f32}) == shape_t{1, 4, 4, 4});
  CHECK_THROWS_WITH_AS(infer(*grouped, {{1, 5, 4, 4}}, {dtype::f32}),
                       doctest::Contains("conv2d: input channels 5 are not divisible by groups=2"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({5, 3, 1, 1, 1, 2}),
                       doctest::Contains("out=5 output channels are not divisible by groups=2"), op_error);
  // Attributes.
  CHECK_THROWS_WITH_AS(make_op("conv2d", attr_map({{"kernel", "3"}})),
                       doctest::Contains("conv2d: missing attribute 'out'"), op_error);
  CHECK_THROWS_WITH_AS(make_op("conv2d", attr_map({{"out", "3"}})),
                       doctest::Contains("conv2d: missing attribute 'kernel'"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({0, 3}), doctest::Contains("'out' must be positive"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({2, 0}), doctest::Contains("'kernel' must be positive"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({2, 3, 0}), doctest::Contains("'stride' must be positive"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({2, 3, 1, -1}), doctest::Contains("'padding' must be >= 0, got -1"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({2, 3, 1, 0, 0}), doctest::Contains("'dilation' must be positive"), op_error);
  CHECK_THROWS_WITH_AS(conv_op({2, 3, 1, 0, 1, 0}), doctest::Contains("'groups' must be positive"), op_error);
  CHECK_THROWS_WITH_AS(make_op("conv2d", attr_map({{"out", "2"}, {"kernel", "3"}, {"stride", "two"}})),
                       doctest::Contains("conv2d: attribute 'stride' must be an integer"), op_error);
  CHECK_THROWS_WITH_AS(make_op("conv2d", attr_map({{"out", "2"}, {"kernel", "3"}, {"init_std", "-1"}})),
                       doctest::Contains("'init_std' must be >= 0"), op_error);
  // Geometry past 2^31 overflowed int64 in the output size and in the default init_std
  // (found by tests/fuzz/fuzz_model.cpp; seeds tests/fuzz/corpus/model/conv-huge-*.pbtxt).
  const std::string huge = "4611686018427387904";  // 2^62
  for (const char* key : {"kernel", "stride", "padding", "dilation"}) {
    attr_map a({{"out", "2"}, {"kernel", "3"}});
    a.set(key, huge);
    const std::string why = "attribute '" + std::string(key) + "' is " + huge + ", more than the limit of 2^31";
    CHECK_THROWS_WITH_AS(make_op("conv2d", a), doctest::Contains(why.c_str()), op_error);
  }
  auto wide = make_op("conv2d", attr_map({{"out", "4294967296"}, {"kernel", "2147483648"}}));
  CHECK_THROWS_AS(infer(*wide, {{1, 1, 4, 4}}, {dtype::f32}), op_error);  // too small, not undefined behaviour
  CHECK(infer(*conv_op({2, 3, 1, 2147483647}), {{1, 1, 4, 4}}, {dtype::f32}).size() == 4);
  // A weight of the wrong shape handed to forward.
  tensor x({1, 3, 4, 4}, dtype::f64), w({8, 2, 3, 3}, dtype::f64), b({8}, dtype::f64), y({1, 8, 2, 2}, dtype::f64);
  const tensor* ins[] = {&x};
  const tensor* ps[] = {&w, &b};
  CHECK_THROWS_WITH_AS(o->forward({ins, ps, &y, nullptr}), doctest::Contains("param weight has shape"), op_error);
}

TEST_CASE("ops/conv2d: params follow the PyTorch layout and kaiming fan_out init") {
  std::vector<shape_t> in{{2, 6, 8, 8}};
  auto ps = conv_op({16, 3, 1, 1, 1, 2})->params(in);
  REQUIRE(ps.size() == 2);
  CHECK(ps[0].name == "weight");
  CHECK(ps[0].shape == shape_t{16, 3, 3, 3});
  CHECK(ps[0].init == param_init::normal);
  CHECK(ps[0].stddev == doctest::Approx(std::sqrt(2.0 / (16 * 9))));
  CHECK(ps[0].decay);
  CHECK(ps[1].name == "bias");
  CHECK(ps[1].shape == shape_t{16});
  CHECK(ps[1].init == param_init::zeros);
  CHECK_FALSE(ps[1].decay);
  CHECK(conv_op({16, 3, 1, 1, 1, 1, false})->params(in).size() == 1);
  auto scaled = make_op("conv2d", attr_map({{"out", "4"}, {"kernel", "1"}, {"init_std", "0.005"}}))->params(in);
  CHECK(scaled[0].shape == shape_t{4, 6, 1, 1});
  CHECK(scaled[0].stddev == doctest::Approx(0.005));
  CHECK(*op_attributes("conv2d") ==
        std::vector<std::string>{"out", "kernel", "stride", "padding", "dilation", "groups", "bias", "init_std"});
}

TEST_CASE("ops/conv2d: cost is the analytic FLOP count") {
  // (8, 6, 10, 12) -> (8, 4, 5, 6) with 3x3, stride 2, padding 1, groups 2.
  std::vector<shape_t> in{{8, 6, 10, 12}};
  const double B = 8, Cin = 6, H = 10, W = 12, Cout = 4, Ho = 5, Wo = 6, G = 2, k = 3;
  const double macs = B * Cout * Ho * Wo * (Cin / G) * k * k;
  const double Y = B * Cout * Ho * Wo, X = B * Cin * H * W, Wn = Cout * (Cin / G) * k * k;
  auto c = conv_op({4, 3, 2, 1, 1, 2})->cost(in);
  CHECK(c.flops_forward == 2 * macs + Y);
  CHECK(c.flops_backward == 4 * macs + Y);
  CHECK(c.param_bytes == (Wn + Cout) * 4);
  CHECK(c.output_bytes == Y * 4);
  CHECK(c.bytes_forward == (X + Wn + Cout + Y) * 4);
  CHECK(c.bytes_backward == (X + Wn + Y + 2 * (X + Wn + Cout)) * 4);
  auto nb = conv_op({4, 3, 2, 1, 1, 2, false})->cost(in);
  CHECK(nb.flops_forward == 2 * macs);
  CHECK(nb.flops_backward == 4 * macs);
  CHECK(nb.param_bytes == Wn * 4);
}
