// The parity cases of the transformer ops (FUSION_PARITY_CASE, run by tests/cuda/parity_test.cpp):
// each CUDA op against its CPU twin on fresh random inputs: forward with a NaN-poisoned output,
// backward accumulating onto non-zero gradients. Tolerances (max_rel_diff: |a-b| / max(1,|b|)):
//   copies, adds and ReLU            1e-6 (same float operations, at most reordered sums)
//   GELU, embeddings with atomics    1e-5 (tanhf vs the CPU's rational tanh; atomic order)
//   layernorm, softmax-based ops     1e-4 (block reductions in another order than the CPU's)
//   cuBLAS GEMM-based ops            2e-3 (fp32 GEMMs, TF32 off; different blocking and order)
// Every comparison runs again on a backend with bf16 GEMMs, within bf16_tol of the tensor's
// largest magnitude (cuda_test_util.hpp). Without a CUDA device every case prints "skipped: ..."
// and returns.
#include <doctest/doctest.h>

#include <random>

#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

namespace {
constexpr double exact_tol = 1e-6, elementwise_tol = 1e-5, reduction_tol = 1e-4, gemm_tol = 2e-3;
}  // namespace

FUSION_PARITY_CASE(token_embedding, g) {
  std::mt19937 rng(1);
  compare_op(g, "token_embedding", attr_map({{"vocab", "50"}, {"dim", "24"}}), {random_ids({3, 17}, 50, rng)},
             exact_tol, elementwise_tol);
  compare_op(g, "token_embedding", attr_map({{"vocab", "7"}, {"dim", "300"}}), {random_ids({4, 64}, 7, rng)},
             exact_tol, elementwise_tol);  // many repeated ids: concurrent atomics on one row
}

FUSION_PARITY_CASE(position_embedding, g) {
  std::mt19937 rng(2);
  compare_op(g, "position_embedding", attr_map({{"max_len", "40"}}), {random_f32({3, 17, 24}, rng)}, exact_tol,
             exact_tol);
}

FUSION_PARITY_CASE(linear, g) {
  std::mt19937 rng(3);
  compare_op(g, "linear", attr_map({{"out", "50"}}), {random_f32({4, 33, 72}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "linear", attr_map({{"out", "130"}, {"bias", "false"}}), {random_f32({65, 40}, rng)}, gemm_tol,
             gemm_tol);
}

FUSION_PARITY_CASE(matmul, g) {
  std::mt19937 rng(4);
  compare_op(g, "matmul", {}, {random_f32({2, 3, 17, 24}, rng), random_f32({2, 3, 24, 19}, rng)}, gemm_tol,
             gemm_tol);
  compare_op(g, "matmul", attr_map({{"transpose_b", "true"}}),
             {random_f32({2, 3, 17, 24}, rng), random_f32({2, 3, 19, 24}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "matmul", {}, {random_f32({5, 9}, rng), random_f32({9, 7}, rng)}, gemm_tol, gemm_tol);
}

FUSION_PARITY_CASE(gelu, g) {
  std::mt19937 rng(5);
  compare_op(g, "gelu", {}, {random_f32({5, 37, 29}, rng, 4.0f)}, elementwise_tol, elementwise_tol);
  // More elements than one grid covers (8192 blocks x 256 threads): the grid-stride loops.
  compare_op(g, "gelu", {}, {random_f32({3, 1024, 1024}, rng, 4.0f)}, elementwise_tol, elementwise_tol);
}

FUSION_PARITY_CASE(relu, g) {
  std::mt19937 rng(5);
  compare_op(g, "relu", {}, {random_f32({5, 37, 29}, rng, 4.0f)}, exact_tol, exact_tol);
}

FUSION_PARITY_CASE(add, g) {
  std::mt19937 rng(6);
  compare_op(g, "add", {}, {random_f32({7, 33, 5}, rng), random_f32({7, 33, 5}, rng)}, exact_tol, exact_tol);
}

FUSION_PARITY_CASE(identity, g) {
  std::mt19937 rng(6);
  compare_op(g, "identity", {}, {random_f32({7, 33, 5}, rng)}, exact_tol, exact_tol);
}

FUSION_PARITY_CASE(layernorm, g) {
  std::mt19937 rng(7);
  // An offset mean checks the two-pass variance; C = 300 exceeds one block of threads.
  compare_op(g, "layernorm", {}, {random_f32({4, 19, 72}, rng, 1.0f, 3.0f)}, reduction_tol, reduction_tol);
  compare_op(g, "layernorm", attr_map({{"eps", "1e-3"}}), {random_f32({3, 300}, rng, 2.0f)}, reduction_tol,
             reduction_tol);
  compare_op(g, "layernorm", {}, {random_f32({5, 20}, rng)}, reduction_tol, reduction_tol);
}

FUSION_PARITY_CASE(attention, g) {
  std::mt19937 rng(8);
  compare_op(g, "attention", attr_map({{"heads", "4"}}), {random_f32({2, 37, 3 * 48}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "2"}, {"causal", "false"}}), {random_f32({2, 20, 3 * 32}, rng)},
             gemm_tol, gemm_tol);
  // T = 300 > 256 threads per softmax row, and more than the CPU's 64-row blocks.
  compare_op(g, "attention", attr_map({{"heads", "2"}}), {random_f32({1, 300, 3 * 16}, rng, 2.0f)}, gemm_tol,
             gemm_tol);
  // The fused kernels' edges: T = 1; tiles of 64 with T not a multiple (130 = 2 x 64 + 2); every
  // head width they compile (16, 32, 64, 128) with head sizes that pad it (12, 48, 96); larger
  // scores for the online maximum; and a head of 160, which takes the cuBLAS path.
  compare_op(g, "attention", attr_map({{"heads", "2"}}), {random_f32({3, 1, 3 * 64}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "3"}}), {random_f32({2, 130, 3 * 192}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "2"}, {"causal", "false"}}), {random_f32({2, 130, 3 * 128}, rng)},
             gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "2"}}), {random_f32({1, 200, 3 * 96}, rng, 2.0f)}, gemm_tol,
             gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "1"}}), {random_f32({2, 65, 3 * 96}, rng)}, gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "1"}, {"causal", "false"}}), {random_f32({1, 77, 3 * 128}, rng)},
             gemm_tol, gemm_tol);
  compare_op(g, "attention", attr_map({{"heads", "1"}}), {random_f32({1, 40, 3 * 160}, rng)}, gemm_tol, gemm_tol);
  // A head of 10 floats: rows are not 16-byte aligned, so tiles load float by float.
  compare_op(g, "attention", attr_map({{"heads", "2"}}), {random_f32({2, 70, 3 * 20}, rng)}, gemm_tol, gemm_tol);
}

TEST_CASE("cuda attention: the fused path keeps no T x T tensor and its backward repeats bit for bit") {
  FUSION_GPU_OR_SKIP(g);
  for (const parity_pass pass : parity_passes(g)) {
    INFO((pass.bf16 ? "bf16" : "fp32"));
    backend& b = *pass.g;
    std::mt19937 rng(13);
    const int64_t B = 2, T = 300, C = 256, NH = 4;
    auto op = b.make_op("attention", attr_map({{"heads", "4"}}));
    const tensor x = b.upload(random_f32({B, T, 3 * C}, rng));
    const tensor dout = b.upload(random_f32({B, T, C}, rng));
    const std::vector<const tensor*> in{&x};
    tensor out = b.empty({B, T, C}, dtype::f32);
    std::vector<tensor> saved;
    op->forward({in, {}, &out, &saved, b.context()});
    int64_t kept = 0;
    for (auto& t : saved) kept += t.numel();
    CHECK_MESSAGE(kept <= B * NH * T + B * T * C, "saved " << kept << " floats: more than lse and the output");
    std::vector<tensor> grads;
    for (int run = 0; run < 2; ++run) {
      tensor dx = b.zeros({B, T, 3 * C}, dtype::f32);
      std::vector<tensor*> din{&dx};
      op->backward({in, {}, &dout, &saved, din, {}, b.context()});
      grads.push_back(b.download(dx));
    }
    CHECK(max_rel_diff(grads[0], grads[1]) == 0.0);
  }
}

FUSION_PARITY_CASE(cross_entropy, g) {
  std::mt19937 rng(9);
  compare_op(g, "cross_entropy", {}, {random_f32({3, 17, 50}, rng, 5.0f), random_ids({3, 17}, 50, rng)},
             reduction_tol, reduction_tol);
  // V = 1000 > 256 threads per row; large logits check the max subtraction.
  compare_op(g, "cross_entropy", {}, {random_f32({2, 5, 1000}, rng, 40.0f), random_ids({2, 5}, 1000, rng)},
             reduction_tol, reduction_tol);
}

TEST_CASE("cuda bf16 GEMMs round their operands to bf16 and stay within bf16's precision") {
  FUSION_GPU_OR_SKIP(g);
  backend& h = *gpu_bf16();
  // K = 512: a linear forward whose fp32 result is within float rounding of the CPU's, and whose
  // bf16 result is not (the runtime.precision setting reached cuBLAS) yet within bf16_tol.
  std::mt19937 rng(12);
  const attr_map attrs({{"out", "256"}});
  const std::vector<tensor> x{random_f32({64, 512}, rng)};
  const std::vector<shape_t> shapes{x[0].shape()};
  auto cpu_op = make_op("linear", attrs);
  std::vector<tensor> params;
  for (auto& ps : cpu_op->params(shapes)) params.push_back(random_f32(ps.shape, rng));
  tensor want({64, 256}, dtype::f32);
  std::vector<tensor> saved;
  cpu_op->forward({ptrs(x), ptrs(params), &want, &saved});
  auto run_on = [&](backend& b) {
    auto op = b.make_op("linear", attrs);
    std::vector<tensor> dp;
    for (auto& p : params) dp.push_back(b.upload(p));
    const std::vector<tensor> dx{b.upload(x[0])};
    tensor out = b.empty({64, 256}, dtype::f32);
    std::vector<tensor> s;
    op->forward({ptrs(dx), ptrs(dp), &out, &s, b.context()});
    return rel_to_max(b.download(out), want);
  };
  const double e32 = run_on(g), e16 = run_on(h);
  MESSAGE("linear 64x512 -> 256, error relative to the largest output: fp32 " << e32 << ", bf16 " << e16);
  // Measured on an H100 (cuBLAS 13): fp32 3.3e-7, bf16 2.5e-4. The bounds sit a factor of 5 to
  // 15 away from each, and bf16 must be at least 10x fp32: the two cannot be confused.
  CHECK(e32 < 5e-6);
  CHECK(e16 > 5e-5);
  CHECK(e16 > 10 * e32);
  CHECK(e16 < bf16_tol);
}

TEST_CASE("cuda ops reject host tensors and other dtypes with op_error") {
  FUSION_GPU_OR_SKIP(g);
  auto op = g.make_op("gelu", {});
  tensor x({4, 4}, dtype::f32);  // on the host
  tensor out = g.empty({4, 4}, dtype::f32);
  std::vector<const tensor*> in{&x};
  std::vector<tensor> saved;
  CHECK_THROWS_AS(op->forward({in, {}, &out, &saved, g.context()}), op_error);
  tensor x64 = g.upload(tensor({4, 4}, dtype::f64));
  tensor out64 = g.empty({4, 4}, dtype::f64);
  std::vector<const tensor*> in64{&x64};
  CHECK_THROWS_AS(op->forward({in64, {}, &out64, &saved, g.context()}), op_error);
  CHECK_THROWS_AS(g.make_op("no_such_op", {}), op_error);
}

TEST_CASE("cuda bad token and target ids are reported at synchronize") {
  FUSION_GPU_OR_SKIP(g);
  auto op = g.make_op("token_embedding", attr_map({{"vocab", "10"}, {"dim", "4"}}));
  tensor ids = g.upload(tensor::from_i32({1, 3}, std::vector<int32_t>{1, 99, 2}));
  tensor w = g.zeros({10, 4}, dtype::f32);
  tensor out = g.empty({1, 3, 4}, dtype::f32);
  std::vector<const tensor*> in{&ids}, ps{&w};
  std::vector<tensor> saved;
  op->forward({in, ps, &out, &saved, g.context()});
  try {
    g.synchronize();
    FAIL("no error reported for token id 99");
  } catch (const op_error& e) {
    CHECK(std::string(e.what()).find("token id 99 at position 1") != std::string::npos);
  }
  CHECK_NOTHROW(g.synchronize());  // reported once, then cleared
}

}  // namespace fusion::test
