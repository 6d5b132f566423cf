// The parity cases of the convolutional-network ops (FUSION_PARITY_CASE, run by
// tests/cuda/parity_test.cpp: conv2d, batchnorm2d, max_pool2d, avg_pool2d, global_avg_pool,
// flatten) and cross_entropy's accuracy metric on the GPU against their CPU twins.
//
// Shape legend: B batch, C channels, H x W pixels, V classes. Every comparison runs forward on
// both backends (CUDA output poisoned with NaN), compares the output, the saved tensors (i32
// exactly), the buffers after forward and the metrics, then backward onto non-zero gradients.
// Tolerances (max_rel_diff, |a-b| / max(1,|b|)) as tests/cuda/ops_test.cpp: 1e-6 for pooling
// and flatten (same float operations in the same order), 1e-4 for the block reductions (batch
// norm, global average), 2e-3 for the cuBLAS-based convolution.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

namespace {

constexpr double exact_tol = 1e-6, reduction_tol = 1e-4, gemm_tol = 2e-3;

struct run_opts {
  bool training = true;
  bool backward = true;  ///< run and compare backward (an evaluation forward saves nothing)
  bool metrics = false;  ///< pass forward_args::metrics and compare the values
};

// max |a-b| / max(1,|b|) over the elements where both are numbers, or with `to_max` max |a-b| /
// max |b| (rel_to_max, the bf16 measure); +inf when NaN positions differ (a NaN only in `a` is
// also an element CUDA left unwritten).
double nan_aware_diff(const tensor& a, const tensor& b, bool to_max) {
  REQUIRE(a.shape() == b.shape());
  double d = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.f32()[i], y = b.f32()[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double diff = std::abs(double(x) - double(y));
    d = std::max(d, to_max ? diff : diff / std::max(1.0, std::abs(double(y))));
    scale = std::max(scale, std::abs(double(y)));
  }
  return to_max && scale > 0 ? d / scale : d;
}

void check_close(backend& g, const tensor& dev, const tensor& ref, double tol, const std::string& what,
                 bool bf16 = false) {
  const tensor h = g.download(dev);
  REQUIRE_MESSAGE(h.type() == ref.type(), what << ": dtype differs");
  REQUIRE_MESSAGE(h.shape() == ref.shape(), what << ": shape " << to_string(h.shape()) << " vs "
                                                 << to_string(ref.shape()));
  if (h.type() == dtype::i32) {
    int64_t bad = 0;
    for (int64_t i = 0; i < h.numel(); ++i) bad += h.i32()[i] != ref.i32()[i] ? 1 : 0;
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << h.numel() << " indices differ from the CPU");
    return;
  }
  const double e = nan_aware_diff(h, ref, bf16);
  CHECK_MESSAGE(e <= tol, what << " differs from the CPU by " << e << " > " << tol);
}

std::vector<tensor*> mut_ptrs(std::vector<tensor>& v) {
  std::vector<tensor*> out;
  for (auto& t : v) out.push_back(&t);
  return out;
}

// One pass of compare_cnn on `g` (in bf16 within bf16_tol by rel_to_max, as compare_op).
void compare_cnn_once(backend& g, bool bf16, const std::string& kind, const attr_map& attrs,
                      const std::vector<tensor>& inputs, double fwd_tol, double bwd_tol, run_opts o, uint32_t seed) {
  if (bf16) fwd_tol = bwd_tol = bf16_tol;
  INFO("op " << kind << (o.training ? " (training)" : " (evaluation)") << (bf16 ? " with bf16 GEMMs" : ""));
  auto cpu_op = make_op(kind, attrs);
  auto gpu_op = g.make_op(kind, attrs);
  std::vector<shape_t> shapes;
  std::vector<dtype> types;
  for (auto& t : inputs) shapes.push_back(t.shape()), types.push_back(t.type());
  const shape_t out_shape = cpu_op->infer_shape(shapes, types);
  REQUIRE(gpu_op->infer_shape(shapes, types) == out_shape);
  REQUIRE(gpu_op->buffers(shapes).size() == cpu_op->buffers(shapes).size());
  REQUIRE(gpu_op->metric_names() == cpu_op->metric_names());
  std::mt19937 rng(seed);
  std::vector<tensor> params, bufs_c, d_inputs, d_params, bufs_g;
  for (auto& ps : cpu_op->params(shapes)) params.push_back(random_f32(ps.shape, rng));
  for (auto& bs : cpu_op->buffers(shapes))
    bufs_c.push_back(random_f32(bs.shape, rng, 0.5f, bs.init == param_init::ones ? 1.0f : 0.0f));
  for (auto& t : inputs) d_inputs.push_back(g.upload(t));
  for (auto& t : params) d_params.push_back(g.upload(t));
  for (auto& t : bufs_c) bufs_g.push_back(g.upload(t));
  const std::vector<tensor> bufs_before = bufs_c;

  std::vector<tensor> saved_c, saved_g;
  std::vector<metric_value> metrics_c, metrics_g;
  tensor out_c = tensor::uninitialized(out_shape, dtype::f32);
  const auto in_c = ptrs(inputs), p_c = ptrs(params), in_g = ptrs(d_inputs), p_g = ptrs(d_params);
  const auto b_c = mut_ptrs(bufs_c), b_g = mut_ptrs(bufs_g);
  forward_args fc{in_c, p_c, &out_c, &saved_c};
  fc.buffers = b_c, fc.training = o.training, fc.metrics = o.metrics ? &metrics_c : nullptr;
  cpu_op->forward(fc);
  tensor out_g = g.empty(out_shape, dtype::f32);
  out_g.fill(std::numeric_limits<float>::quiet_NaN());
  forward_args fg{in_g, p_g, &out_g, &saved_g, g.context()};
  fg.buffers = b_g, fg.training = o.training, fg.metrics = o.metrics ? &metrics_g : nullptr;
  gpu_op->forward(fg);
  g.synchronize();
  check_close(g, out_g, out_c, fwd_tol, "output", bf16);
  REQUIRE_MESSAGE(saved_g.size() == saved_c.size(), "saved " << saved_g.size() << " tensors, CPU " << saved_c.size());
  for (size_t i = 0; i < saved_c.size(); ++i)
    check_close(g, saved_g[i], saved_c[i], fwd_tol, "saved " + std::to_string(i), bf16);
  for (size_t i = 0; i < bufs_c.size(); ++i) {
    check_close(g, bufs_g[i], bufs_c[i], fwd_tol, "buffer " + std::to_string(i), bf16);
    if (!o.training)  // evaluation reads the running statistics only
      CHECK_MESSAGE(max_rel_diff(g.download(bufs_g[i]), bufs_before[i]) == 0, "buffer " << i << " changed in eval");
  }
  REQUIRE(metrics_g.size() == metrics_c.size());
  for (size_t i = 0; i < metrics_c.size(); ++i) {
    CHECK(metrics_g[i].sum == metrics_c[i].sum);
    CHECK(metrics_g[i].count == metrics_c[i].count);
  }
  if (!o.backward) return;

  backward_pair bw;
  run_backward_pair(g, *cpu_op, *gpu_op, inputs, params, out_shape, in_c, p_c, saved_c, in_g, p_g, saved_g, rng, bw);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (bw.din_c_p[i])
      check_close(g, bw.din_g[i], bw.din_c[i], bwd_tol, "input " + std::to_string(i) + " grad", bf16);
  for (size_t i = 0; i < bw.dp_c.size(); ++i)
    check_close(g, bw.dp_g[i], bw.dp_c[i], bwd_tol, "param " + std::to_string(i) + " grad", bf16);
}

// compare_op (cuda_test_util.hpp) extended by buffers, the training flag, saved tensors and
// metrics, on the fp32 and then the bf16 backend. Buffers start random (running_var positive)
// so evaluation is not the identity.
void compare_cnn(backend& g, const std::string& kind, const attr_map& attrs, const std::vector<tensor>& inputs,
                 double fwd_tol, double bwd_tol, run_opts o = {}, uint32_t seed = 11) {
  for (const parity_pass pass : parity_passes(g))
    compare_cnn_once(*pass.g, pass.bf16, kind, attrs, inputs, fwd_tol, bwd_tol, o, seed);
}

// Integer values in [-levels, -1]: many ties and nothing above the padding's would-be zero.
tensor tied_negative(const shape_t& s, std::mt19937& rng, int levels) {
  tensor t(s, dtype::f32);
  std::uniform_int_distribution<int> u(1, levels);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = -static_cast<float>(u(rng));
  return t;
}

// Correct rows reported by cross_entropy's accuracy metric on the CPU (gpu == null) or the GPU.
double accuracy_of(backend& g, backend* gpu, const tensor& logits, const tensor& targets) {
  auto op = gpu ? gpu->make_op("cross_entropy", {}) : make_op("cross_entropy", {});
  const tensor l = gpu ? g.upload(logits) : logits, t = gpu ? g.upload(targets) : targets;
  tensor loss = gpu ? g.empty({}, dtype::f32) : tensor({}, dtype::f32);
  std::vector<const tensor*> in{&l, &t};
  std::vector<tensor> saved;
  std::vector<metric_value> m;
  forward_args f{in, {}, &loss, &saved, gpu ? g.context() : nullptr};
  f.metrics = &m;
  op->forward(f);
  REQUIRE(m.size() == 1);
  CHECK(m[0].count == static_cast<double>(targets.numel()));
  return m[0].sum;
}

attr_map conv(const char* out, const char* k, const char* stride = "1", const char* pad = "0", const char* dil = "1",
              const char* groups = "1", const char* bias = "true") {
  return attr_map({{"out", out}, {"kernel", k}, {"stride", stride}, {"padding", pad}, {"dilation", dil},
                   {"groups", groups}, {"bias", bias}});
}

}  // namespace

FUSION_PARITY_CASE(conv2d, g) {
  std::mt19937 rng(21);
  compare_cnn(g, "conv2d", conv("4", "3"), {random_f32({2, 3, 9, 9}, rng)}, gemm_tol, gemm_tol);
  // Stride and padding on a non-square image.
  compare_cnn(g, "conv2d", conv("8", "3", "2", "1"), {random_f32({3, 5, 11, 8}, rng)}, gemm_tol, gemm_tol);
  // Dilation: taps two pixels apart. Then stride 3 > kernel 2: pixels no output sees.
  compare_cnn(g, "conv2d", conv("5", "3", "1", "2", "2"), {random_f32({2, 4, 10, 9}, rng)}, gemm_tol, gemm_tol);
  compare_cnn(g, "conv2d", conv("3", "2", "3", "0"), {random_f32({2, 2, 10, 11}, rng)}, gemm_tol, gemm_tol);
  // Groups without bias, and a depthwise convolution (groups == in channels).
  compare_cnn(g, "conv2d", conv("6", "3", "1", "1", "1", "2", "false"), {random_f32({2, 4, 7, 7}, rng)}, gemm_tol,
              gemm_tol);
  compare_cnn(g, "conv2d", conv("6", "5", "2", "2", "1", "3"), {random_f32({2, 3, 12, 12}, rng)}, gemm_tol, gemm_tol);
  // 1x1, stride 1, no padding: the input is its own column matrix (no im2col, din by GEMM).
  compare_cnn(g, "conv2d", conv("6", "1", "1", "0", "1", "2"), {random_f32({3, 4, 5, 6}, rng)}, gemm_tol, gemm_tol);
  compare_cnn(g, "conv2d", conv("6", "1", "2", "0"), {random_f32({3, 4, 5, 6}, rng)}, gemm_tol, gemm_tol);
  // 64 * 9 rows x 56 * 56 pixels = 1.8M floats per image: 20 images take two column chunks.
  compare_cnn(g, "conv2d", conv("8", "3", "1", "1"), {random_f32({20, 64, 56, 56}, rng)}, gemm_tol, gemm_tol);
}

// In training and evaluation.
FUSION_PARITY_CASE(batchnorm2d, g) {
  std::mt19937 rng(22);
  const attr_map none;
  // Offset mean checks the centred variance; saved mean/rstd and the running statistics compared.
  compare_cnn(g, "batchnorm2d", none, {random_f32({4, 5, 6, 7}, rng, 2.0f, 3.0f)}, reduction_tol, reduction_tol);
  compare_cnn(g, "batchnorm2d", attr_map({{"eps", "1e-3"}, {"momentum", "0.3"}}), {random_f32({8, 3}, rng)},
              reduction_tol, reduction_tol);
  // n = 16 * 400 values per channel: more than one block of threads per channel.
  compare_cnn(g, "batchnorm2d", none, {random_f32({16, 3, 20, 20}, rng, 1.0f, -2.0f)}, reduction_tol, reduction_tol);
  compare_cnn(g, "batchnorm2d", none, {random_f32({2, 2}, rng)}, reduction_tol, reduction_tol);  // n = 2
  run_opts eval;
  eval.training = false, eval.backward = false;
  compare_cnn(g, "batchnorm2d", none, {random_f32({4, 5, 6, 7}, rng, 2.0f, 3.0f)}, reduction_tol, 0, eval);
  compare_cnn(g, "batchnorm2d", none, {random_f32({1, 3}, rng)}, reduction_tol, 0, eval);  // n = 1 is fine here

  // n == 1 cannot give an unbiased variance in training; after evaluation backward has no stats.
  auto op = g.make_op("batchnorm2d", none);
  tensor x = g.upload(random_f32({1, 3, 1, 1}, rng)), out = g.empty({1, 3, 1, 1}, dtype::f32);
  tensor w = g.upload(random_f32({3}, rng)), b = g.zeros({3}, dtype::f32);
  tensor rm = g.zeros({3}, dtype::f32), rv = g.zeros({3}, dtype::f32);
  std::vector<const tensor*> in{&x}, ps{&w, &b};
  std::vector<tensor*> bufs{&rm, &rv};
  std::vector<tensor> saved;
  forward_args f{in, ps, &out, &saved, g.context()};
  f.buffers = bufs;
  CHECK_THROWS_AS(op->forward(f), op_error);
  f.training = false;
  op->forward(f);
  CHECK(saved.empty());
  tensor dx = g.zeros({1, 3, 1, 1}, dtype::f32);
  std::vector<tensor*> dins{&dx}, dps{nullptr, nullptr};
  CHECK_THROWS_AS(op->backward({in, ps, &out, &saved, dins, dps, g.context()}), op_error);
  f.buffers = {};
  CHECK_THROWS_AS(op->forward(f), op_error);  // the running statistics are required
}

// Ties and padding included.
FUSION_PARITY_CASE(max_pool2d, g) {
  std::mt19937 rng(23);
  compare_cnn(g, "max_pool2d", attr_map({{"kernel", "2"}}), {random_f32({2, 3, 8, 8}, rng)}, exact_tol, exact_tol);
  // Three levels of negative integers: ties in nearly every window (the first maximum wins and
  // takes the whole gradient); padding must lose to -3 (padding is -inf, not 0).
  compare_cnn(g, "max_pool2d", attr_map({{"kernel", "3"}, {"stride", "2"}, {"padding", "1"}}),
              {tied_negative({2, 3, 9, 10}, rng, 3)}, exact_tol, exact_tol);
  // Overlapping windows (stride 1): one pixel can be the maximum of several outputs.
  compare_cnn(g, "max_pool2d", attr_map({{"kernel", "3"}, {"stride", "1"}, {"padding", "1"}}),
              {tied_negative({2, 2, 7, 7}, rng, 2)}, exact_tol, exact_tol);
  // Stride beyond the kernel: some pixels are in no window.
  compare_cnn(g, "max_pool2d", attr_map({{"kernel", "2"}, {"stride", "3"}}), {random_f32({2, 2, 11, 10}, rng)},
              exact_tol, exact_tol);
  // NaN beats every number (the first NaN of a window wins): outputs and argmax as the CPU's.
  tensor x = tied_negative({1, 2, 6, 6}, rng, 2);
  x.f32()[7] = x.f32()[9] = x.f32()[40] = std::numeric_limits<float>::quiet_NaN();
  compare_cnn(g, "max_pool2d", attr_map({{"kernel", "3"}, {"stride", "1"}, {"padding", "1"}}), {x}, exact_tol,
              exact_tol);
}

FUSION_PARITY_CASE(avg_pool2d, g) {
  std::mt19937 rng(24);
  compare_cnn(g, "avg_pool2d", attr_map({{"kernel", "2"}}), {random_f32({2, 3, 8, 8}, rng)}, exact_tol, exact_tol);
  // Padding counts in the divisor (k * k always).
  compare_cnn(g, "avg_pool2d", attr_map({{"kernel", "3"}, {"stride", "2"}, {"padding", "1"}}),
              {random_f32({2, 3, 9, 10}, rng, 1.0f, 2.0f)}, exact_tol, exact_tol);
  compare_cnn(g, "avg_pool2d", attr_map({{"kernel", "3"}, {"stride", "1"}, {"padding", "1"}}),
              {random_f32({2, 2, 7, 5}, rng)}, exact_tol, exact_tol);
  compare_cnn(g, "avg_pool2d", attr_map({{"kernel", "2"}, {"stride", "3"}}), {random_f32({1, 2, 11, 10}, rng)},
              exact_tol, exact_tol);
}

FUSION_PARITY_CASE(global_avg_pool, g) {
  std::mt19937 rng(25);
  compare_cnn(g, "global_avg_pool", {}, {random_f32({2, 3, 5, 7}, rng)}, reduction_tol, exact_tol);
  compare_cnn(g, "global_avg_pool", {}, {random_f32({2, 2, 40, 40}, rng, 1.0f, 1.0f)}, reduction_tol, exact_tol);
}

FUSION_PARITY_CASE(flatten, g) {
  std::mt19937 rng(27);
  compare_cnn(g, "flatten", {}, {random_f32({2, 3, 4, 5}, rng)}, exact_tol, exact_tol);
  compare_cnn(g, "flatten", {}, {random_f32({3, 7}, rng)}, exact_tol, exact_tol);
}

TEST_CASE("cuda cross_entropy reports accuracy like the CPU") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(26);
  run_opts with_metrics;
  with_metrics.metrics = true;
  REQUIRE(g.make_op("cross_entropy", {})->metric_names() == std::vector<std::string>{"accuracy"});
  compare_cnn(g, "cross_entropy", {}, {random_f32({3, 17, 10}, rng, 5.0f), random_ids({3, 17}, 10, rng)},
              reduction_tol, reduction_tol, with_metrics);
  // V = 1000 > 256 threads per row.
  compare_cnn(g, "cross_entropy", {}, {random_f32({4, 9, 1000}, rng, 5.0f), random_ids({4, 9}, 1000, rng)},
              reduction_tol, reduction_tol, with_metrics);

  // Ties: the FIRST index of the maximum is the prediction, also across threads and warps
  // (V = 600: indices 5 and 300 lie in different warps and 5, 261 in one thread's stride).
  const int64_t V = 600;
  tensor logits({4, V}, dtype::f32);
  for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = -1.0f;
  auto at = [&](int64_t r, int64_t j) -> float& { return logits.f32()[r * V + j]; };
  at(0, 5) = at(0, 300) = 2.0f;  // prediction 5: target 5 right
  at(1, 5) = at(1, 300) = 2.0f;  // prediction 5: target 300 wrong
  at(2, 261) = at(2, 5) = 3.0f;  // prediction 5: target 261 wrong
  at(3, 599) = 4.0f;             // prediction 599: target 599 right
  const tensor targets = tensor::from_i32({4}, std::vector<int32_t>{5, 300, 261, 599});
  compare_cnn(g, "cross_entropy", {}, {logits, targets}, reduction_tol, reduction_tol, with_metrics);
  CHECK(accuracy_of(g, &g, logits, targets) == 2);

  // NaN logits as std::max_element sees them: a NaN first logit is the prediction, a later NaN
  // never is. Only the metric is compared (the loss and row max of a NaN row are NaN or not
  // depending on where each backend's max meets the NaN).
  tensor nan_logits = random_f32({3, 40}, rng, 2.0f);
  nan_logits.f32()[0] = std::numeric_limits<float>::quiet_NaN();       // row 0 predicts 0
  nan_logits.f32()[40 + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1: skipped
  nan_logits.f32()[40 + 7] = 5.0f;                                     // row 1 predicts 7
  const tensor nan_targets = tensor::from_i32({3}, std::vector<int32_t>{0, 7, 1});
  CHECK(accuracy_of(g, nullptr, nan_logits, nan_targets) == accuracy_of(g, &g, nan_logits, nan_targets));
  CHECK(accuracy_of(g, &g, nan_logits, nan_targets) >= 2);

  // Without forward_args::metrics nothing is appended (and nothing synchronises).
  auto op = g.make_op("cross_entropy", {});
  tensor dl = g.upload(logits), dt = g.upload(targets), loss = g.empty({}, dtype::f32);
  std::vector<const tensor*> in{&dl, &dt};
  std::vector<tensor> saved;
  op->forward({in, {}, &loss, &saved, g.context()});
  CHECK(saved.size() == 2);
}

}  // namespace fusion::test
