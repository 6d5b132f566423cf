// Helpers of the CUDA tests: the shared GPU backend (or a printed skip without a device), the
// registry of per-kind parity cases, random tensors, and the CPU-vs-CUDA comparison of one op's
// forward and backward.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/backend.hpp"
#include "ops/op.hpp"
#include "tests/ops/gradcheck.hpp"  // random_ids

namespace fusion::test {

/// Why there is no GPU to test on (printed by every skipped case).
inline std::string no_gpu_reason() {
  if (!cuda_compiled()) return "this build has no CUDA backend (FUSION_CUDA=OFF or no nvcc)";
  return "no CUDA device (cuda_device_count() == 0: no GPU or no driver on this machine)";
}

/// The CUDA backend shared by the tests, or null when there is no device.
inline backend* gpu() {
  static const std::unique_ptr<backend> b = []() -> std::unique_ptr<backend> {
    if (cuda_device_count() == 0) return nullptr;
    return make_backend("cuda");
  }();
  return b.get();
}

/// The CUDA backend whose ops' GEMMs compute in bf16 (runtime.precision = bf16), or null.
inline backend* gpu_bf16() {
  static const std::unique_ptr<backend> b = []() -> std::unique_ptr<backend> {
    if (cuda_device_count() == 0) return nullptr;
    return make_backend("cuda", gemm_precision::bf16);
  }();
  return b.get();
}

/// Tolerance of every op's bf16 pass, relative to the largest magnitude of the CPU tensor
/// (rel_to_max): bf16 keeps 8 significant bits, so each operand of a product is rounded by up to
/// 2^-9 relative, and a sum over K products errs by about sqrt(K) such roundings while the
/// tensor's largest element grows like sqrt(K) too. On an H100 a K = 512 linear erred by 2.5e-4;
/// 2e-2 leaves room for other GPUs and cuBLAS versions and stays far below what a wrong index
/// or a missed term gives.
inline constexpr double bf16_tol = 2e-2;

/// One pass of a parity check: the backend and whether it is the bf16 one.
struct parity_pass {
  backend* g;
  bool bf16;
};

/// The passes every op comparison makes: `g` as given, then, when `g` is the shared fp32 GPU
/// backend, the bf16 backend, so every op of every parity test also runs with bf16 GEMMs.
inline std::vector<parity_pass> parity_passes(backend& g) {
  std::vector<parity_pass> out{{&g, false}};
  if (&g == gpu() && gpu_bf16() != nullptr) out.push_back({gpu_bf16(), true});
  return out;
}

/// Declares `backend& NAME` bound to the GPU backend, or prints the skip reason and returns.
/// ctest marks the case skipped from the printed "skipped: " (SKIP_REGULAR_EXPRESSION).
#define FUSION_GPU_OR_SKIP(NAME)                                 \
  if (::fusion::test::gpu() == nullptr) {                        \
    MESSAGE("skipped: " << ::fusion::test::no_gpu_reason());     \
    return;                                                      \
  }                                                              \
  ::fusion::backend& NAME = *::fusion::test::gpu()

/// A kind's parity case: the CUDA op against its CPU twin on `g` (compare_op, compare_cnn).
using parity_case = void (*)(backend& g);

/// Where each kind's parity case was registered (FUSION_PARITY_CASE): the case and the files
/// that registered one (more than one file is an error, reported by tests/cuda/parity_test.cpp).
struct parity_entry {
  parity_case run = nullptr;
  std::vector<std::string> files;
};

/// Every registered parity case by kind; filled before main by FUSION_PARITY_CASE.
inline std::map<std::string, parity_entry>& parity_cases() {
  static std::map<std::string, parity_entry> cases;
  return cases;
}

/// Records `run` as the parity case of `kind`; returns true (for the static initialiser).
inline bool register_parity_case(const char* kind, parity_case run, const char* file) {
  parity_entry& e = parity_cases()[kind];
  e.run = run;
  e.files.push_back(file);
  return true;
}

/// Defines the parity case of op kind KIND (an identifier, as in ops/op_kinds.hpp), a function
/// body that sees the GPU backend as `backend& G`:
///   FUSION_PARITY_CASE(linear, g) { compare_op(g, "linear", ...); }
/// tests/cuda/parity_test.cpp runs it as the test case "cuda KIND matches the CPU" (skipped
/// without a device), and fails, GPU or not, for a kind of the list without a case.
#define FUSION_PARITY_CASE(KIND, G)                                                         \
  static void fusion_parity_##KIND(::fusion::backend& G);                                  \
  [[maybe_unused]] static const bool fusion_parity_registered_##KIND =                      \
      ::fusion::test::register_parity_case(#KIND, fusion_parity_##KIND, __FILE__);          \
  static void fusion_parity_##KIND(::fusion::backend& G)

/// f32 tensor with values uniform in [offset - scale, offset + scale].
inline tensor random_f32(const shape_t& s, std::mt19937& rng, float scale = 1.0f, float offset = 0.0f) {
  tensor t(s, dtype::f32);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = offset + u(rng);
  return t;
}

/// Number of NaN elements of a CPU f32 tensor.
inline int64_t count_nan(const tensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.f32()[i]) ? 1 : 0;
  return n;
}

/// max |a - b| / max |b| over two CPU f32 tensors of one shape: the error relative to the
/// tensor's scale (gradients are often far below 1, where max_rel_diff measures absolutely).
inline double rel_to_max(const tensor& a, const tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.f32()[i]) - double(b.f32()[i])));
    scale = std::max(scale, std::abs(double(b.f32()[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

inline std::vector<const tensor*> ptrs(const std::vector<tensor>& v) {
  std::vector<const tensor*> out;
  for (auto& t : v) out.push_back(&t);
  return out;
}

/// The gradients of one backward call run on a CPU op and on its CUDA twin (run_backward_pair):
/// per input, a CPU and a device gradient (null pointers for inputs without one), then per
/// parameter.
struct backward_pair {
  std::vector<tensor> din_c, din_g, dp_c, dp_g;
  std::vector<tensor*> din_c_p, din_g_p, dp_c_p, dp_g_p;
};

/// Draws from `rng`, in this order, the output gradient and the non-zero start values of every
/// input gradient the op takes (f32 inputs only) and of every parameter gradient (backward
/// accumulates, +=, which is part of the contract), runs backward on both backends and waits
/// for the GPU. `in_*`, `p_*` and `saved_*` are the forward's arguments on each backend.
inline void run_backward_pair(backend& g, const op& cpu_op, const op& gpu_op, const std::vector<tensor>& inputs,
                              const std::vector<tensor>& params, const shape_t& out_shape,
                              const std::vector<const tensor*>& in_c, const std::vector<const tensor*>& p_c,
                              const std::vector<tensor>& saved_c, const std::vector<const tensor*>& in_g,
                              const std::vector<const tensor*>& p_g, const std::vector<tensor>& saved_g,
                              std::mt19937& rng, backward_pair& r) {
  const tensor dout = out_shape.empty() ? tensor::from({}, std::vector<float>{0.75f}) : random_f32(out_shape, rng);
  r.din_c.assign(inputs.size(), tensor{});
  r.din_g.assign(inputs.size(), tensor{});
  r.din_c_p.assign(inputs.size(), nullptr);
  r.din_g_p.assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_op.input_has_grad(i) || inputs[i].type() != dtype::f32) continue;
    r.din_c[i] = random_f32(inputs[i].shape(), rng, 0.5f);
    r.din_g[i] = g.upload(r.din_c[i]);
    r.din_c_p[i] = &r.din_c[i], r.din_g_p[i] = &r.din_g[i];
  }
  for (auto& p : params) r.dp_c.push_back(random_f32(p.shape(), rng, 0.5f));
  for (auto& t : r.dp_c) r.dp_g.push_back(g.upload(t));
  for (size_t i = 0; i < r.dp_c.size(); ++i) r.dp_c_p.push_back(&r.dp_c[i]), r.dp_g_p.push_back(&r.dp_g[i]);
  const tensor d_dout = g.upload(dout);
  const backward_inputs held_c(cpu_op, in_c), held_g(gpu_op, in_g);
  cpu_op.backward({held_c.ptrs, p_c, &dout, &saved_c, r.din_c_p, r.dp_c_p});
  gpu_op.backward({held_g.ptrs, p_g, &d_dout, &saved_g, r.din_g_p, r.dp_g_p, g.context()});
  g.synchronize();
}

/// The error of a CUDA result against the CPU's: max_rel_diff in fp32, rel_to_max in bf16.
inline double parity_error(const tensor& got, const tensor& want, bool bf16) {
  return bf16 ? rel_to_max(got, want) : max_rel_diff(got, want);
}

/// One pass of compare_op on `g`: in bf16, within bf16_tol of the CPU by rel_to_max.
inline void compare_op_once(backend& g, bool bf16, const std::string& kind, const attr_map& attrs,
                            const std::vector<tensor>& inputs, double fwd_tol, double bwd_tol, uint32_t seed) {
  if (bf16) fwd_tol = bwd_tol = bf16_tol;
  INFO("op " << kind << (bf16 ? " with bf16 GEMMs" : ""));
  auto cpu_op = make_op(kind, attrs);
  auto gpu_op = g.make_op(kind, attrs);
  std::vector<shape_t> shapes;
  std::vector<dtype> types;
  for (auto& t : inputs) shapes.push_back(t.shape()), types.push_back(t.type());
  const shape_t out_shape = cpu_op->infer_shape(shapes, types);
  REQUIRE(gpu_op->infer_shape(shapes, types) == out_shape);
  std::mt19937 rng(seed);
  std::vector<tensor> params, d_inputs, d_params;
  for (auto& ps : cpu_op->params(shapes)) params.push_back(random_f32(ps.shape, rng));
  for (auto& t : inputs) d_inputs.push_back(g.upload(t));
  for (auto& t : params) d_params.push_back(g.upload(t));

  // Forward: CPU reference, CUDA output poisoned with NaN.
  std::vector<tensor> saved_c, saved_g;
  tensor out_c = tensor::uninitialized(out_shape, dtype::f32);
  const auto in_c = ptrs(inputs), p_c = ptrs(params), in_g = ptrs(d_inputs), p_g = ptrs(d_params);
  cpu_op->forward({in_c, p_c, &out_c, &saved_c});
  tensor out_g = g.empty(out_shape, dtype::f32);
  out_g.fill(std::numeric_limits<float>::quiet_NaN());
  gpu_op->forward({in_g, p_g, &out_g, &saved_g, g.context()});
  const tensor out_h = g.download(out_g);
  CHECK_MESSAGE(count_nan(out_h) == 0, kind << ": CUDA forward left " << count_nan(out_h) << " elements unwritten");
  const double fe = parity_error(out_h, out_c, bf16);
  CHECK_MESSAGE(fe <= fwd_tol, kind << ": forward differs from the CPU by " << fe << " > " << fwd_tol);

  // Backward onto non-zero gradients: accumulation (+=) is part of the contract.
  backward_pair bw;
  run_backward_pair(g, *cpu_op, *gpu_op, inputs, params, out_shape, in_c, p_c, saved_c, in_g, p_g, saved_g, rng, bw);
  auto check_grad = [&](const tensor& dev, const tensor& ref, const std::string& what) {
    const tensor h = g.download(dev);
    CHECK_MESSAGE(count_nan(h) == 0, kind << ": " << what << " has NaN");
    const double be = parity_error(h, ref, bf16);
    CHECK_MESSAGE(be <= bwd_tol, kind << ": " << what << " differs from the CPU by " << be << " > " << bwd_tol);
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (bw.din_c_p[i]) check_grad(bw.din_g[i], bw.din_c[i], "input " + std::to_string(i) + " grad");
  for (size_t i = 0; i < bw.dp_c.size(); ++i)
    check_grad(bw.dp_g[i], bw.dp_c[i], "param " + std::to_string(i) + " grad");
}

/// Runs op `kind` forward and backward on the CPU and on `g` with the same random parameters,
/// output gradient and non-zero gradient start values, and checks: the CUDA output has no
/// unwritten (NaN-poisoned) element and is within `fwd_tol` of the CPU's (max_rel_diff), and
/// every accumulated gradient is within `bwd_tol` (max_rel_diff). `inputs` are CPU tensors.
/// Then the same with bf16 GEMMs, within bf16_tol (parity_passes).
inline void compare_op(backend& g, const std::string& kind, const attr_map& attrs, const std::vector<tensor>& inputs,
                       double fwd_tol, double bwd_tol, uint32_t seed = 11) {
  for (const parity_pass pass : parity_passes(g))
    compare_op_once(*pass.g, pass.bf16, kind, attrs, inputs, fwd_tol, bwd_tol, seed);
}

}  // namespace fusion::test
