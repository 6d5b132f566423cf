// Finite-difference gradient check for any op, run in double precision through the op contract.
//
// loss = sum(output .* R) for a fixed random R, so dloss/doutput = R. Analytic gradients come from
// op::backward (accumulating onto a non-zero start, which also checks that backward adds rather
// than overwrites); numeric ones from central differences of the same op in f64. Ops with buffers
// (batch norm) run in training mode on fresh default buffers for every forward.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ops/op.hpp"

namespace fusion::test {

/// infer_shape with owning vectors, so tests can pass braced lists.
inline shape_t infer(const op& o, std::vector<shape_t> shapes, std::vector<dtype> types) {
  return o.infer_shape(shapes, types);
}

/// A value for every attribute op `kind` lists (op_attributes): enough to construct any op kind
/// in the table tests; fails the test for an attribute without a value here.
inline attr_map plausible_attributes(const std::string& kind) {
  static const std::map<std::string, std::string> values = {
      {"out", "4"},       {"in", "3"},       {"bias", "true"},    {"init_std", "0.02"},  {"heads", "2"},
      {"causal", "true"}, {"eps", "1e-5"},   {"momentum", "0.1"}, {"transpose_b", "false"},
      {"max_len", "8"},   {"dim", "4"},      {"vocab", "10"},     {"kernel", "3"},       {"stride", "1"},
      {"padding", "1"},   {"dilation", "1"}, {"groups", "1"}};
  attr_map attrs;
  const std::vector<std::string>* names = op_attributes(kind);
  REQUIRE_MESSAGE(names != nullptr, kind << " is not an op kind");
  for (const std::string& n : *names) {
    REQUIRE_MESSAGE(values.count(n) == 1, kind << ": attribute " << n << " has no value in plausible_attributes");
    attrs.set(n, values.at(n));
  }
  return attrs;
}

/// Random f64 tensor with values in [-scale, scale].
inline tensor random_f64(const shape_t& s, std::mt19937& rng, double scale = 1.0) {
  tensor t(s, dtype::f64);
  std::uniform_real_distribution<double> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f64()[i] = u(rng);
  return t;
}

/// Random i32 tensor with values in [0, hi).
inline tensor random_ids(const shape_t& s, int hi, std::mt19937& rng) {
  tensor t(s, dtype::i32);
  std::uniform_int_distribution<int> u(0, hi - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.i32()[i] = u(rng);
  return t;
}

/// The inputs a backward call gets, as the op actor passes them: the forward's inputs, or empty
/// tensors when the op says its backward does not read them (op::backward_reads_inputs), so that
/// every test of such an op's backward also checks that it reads none.
struct backward_inputs {
  backward_inputs(const op& o, const std::vector<tensor>& inputs) : backward_inputs(o, addresses(inputs)) {}
  backward_inputs(const op& o, const std::vector<const tensor*>& inputs) : empty(inputs.size()) {
    const bool reads = o.backward_reads_inputs();
    for (size_t i = 0; i < inputs.size(); ++i) ptrs.push_back(reads ? inputs[i] : &empty[i]);
  }
  backward_inputs(const backward_inputs&) = delete;
  backward_inputs& operator=(const backward_inputs&) = delete;
  std::vector<tensor> empty;
  std::vector<const tensor*> ptrs;

 private:
  static std::vector<const tensor*> addresses(const std::vector<tensor>& v) {
    std::vector<const tensor*> out;
    for (auto& t : v) out.push_back(&t);
    return out;
  }
};

struct gradcheck_result {
  double max_error = 0;  ///< max |analytic - numeric| / max(1e-3, |analytic| + |numeric|)
  std::string where;     ///< which tensor and element had it
};

/// The op's buffers (op::buffers) for these inputs, initialised as the op actor does: zeros or
/// ones, in dtype `type`.
inline std::vector<tensor> default_buffers(const op& o, const std::vector<tensor>& inputs, dtype type) {
  std::vector<shape_t> shapes;
  for (auto& t : inputs) shapes.push_back(t.shape());
  std::vector<tensor> out;
  for (auto& b : o.buffers(shapes)) {
    out.emplace_back(b.shape, type);
    if (b.init == param_init::ones && type == dtype::f64) std::fill_n(out.back().f64(), out.back().numel(), 1.0);
    else if (b.init == param_init::ones) out.back().fill(1.0f);
  }
  return out;
}

/// Runs op forward with an output of dtype `type` poisoned with NaN; returns the output and
/// counts in `unwritten` the elements forward left untouched (still NaN). `buffers` are passed
/// as forward_args::buffers (and updated in place in training mode); when null, fresh default
/// buffers are used (none for most ops). `training` is forward_args::training.
inline tensor forward_poisoned(const op& o, const std::vector<tensor>& inputs, const std::vector<tensor>& params,
                               std::vector<tensor>* saved, dtype type, int64_t& unwritten,
                               std::vector<tensor>* buffers = nullptr, bool training = true) {
  std::vector<shape_t> shapes;
  std::vector<dtype> types;
  std::vector<const tensor*> in_ptrs, p_ptrs;
  for (auto& t : inputs) shapes.push_back(t.shape()), types.push_back(t.type()), in_ptrs.push_back(&t);
  for (auto& t : params) p_ptrs.push_back(&t);
  tensor out(o.infer_shape(shapes, types), type);  // first, so shape errors come from infer_shape
  std::vector<tensor> fresh_buffers;
  if (buffers == nullptr) fresh_buffers = default_buffers(o, inputs, type), buffers = &fresh_buffers;
  std::vector<tensor*> b_ptrs;
  for (auto& t : *buffers) b_ptrs.push_back(&t);
  auto at = [&](int64_t i) { return type == dtype::f64 ? out.f64()[i] : static_cast<double>(out.f32()[i]); };
  if (type == dtype::f64) std::fill_n(out.f64(), out.numel(), std::numeric_limits<double>::quiet_NaN());
  else out.fill(std::numeric_limits<float>::quiet_NaN());
  forward_args fa{in_ptrs, p_ptrs, &out, saved};
  fa.buffers = b_ptrs;
  fa.training = training;
  o.forward(fa);
  unwritten = 0;
  for (int64_t i = 0; i < out.numel(); ++i) unwritten += std::isnan(at(i)) ? 1 : 0;
  return out;
}

/// Runs op forward in f64 with the given inputs (f64 or i32) and params (f64); `buffers` and
/// `training` as in forward_poisoned.
inline tensor run_forward(const op& o, const std::vector<tensor>& inputs, const std::vector<tensor>& params,
                          std::vector<tensor>* saved, std::vector<tensor>* buffers = nullptr,
                          bool training = true) {
  int64_t unwritten = 0;
  tensor out = forward_poisoned(o, inputs, params, saved, dtype::f64, unwritten, buffers, training);
  CHECK_MESSAGE(unwritten == 0, std::string(o.kind()) << ": forward left " << unwritten << " output elements unwritten (NaN)");
  return out;
}

/// Checks every input gradient (where the op has one) and every parameter gradient.
inline gradcheck_result gradcheck(const op& o, std::vector<tensor> inputs, std::vector<tensor> params,
                                  uint32_t seed = 7, double eps = 1e-6) {
  std::mt19937 rng(seed);
  std::vector<tensor> saved;
  tensor out = run_forward(o, inputs, params, &saved);
  tensor r = random_f64(out.shape(), rng);
  auto loss = [&](const std::vector<tensor>& in, const std::vector<tensor>& ps) {
    std::vector<tensor> s;
    tensor y = run_forward(o, in, ps, &s);
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += y.f64()[i] * r.f64()[i];
    return l;
  };
  // Analytic gradients, accumulated onto a known non-zero start.
  const double start = 0.25;
  std::vector<tensor> din, dparam;
  std::vector<tensor*> din_ptrs, dparam_ptrs;
  din.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool has = o.input_has_grad(i) && inputs[i].type() == dtype::f64;
    din.emplace_back(has ? tensor(inputs[i].shape(), dtype::f64) : tensor());
    if (has) std::fill_n(din.back().f64(), din.back().numel(), start);
  }
  for (auto& d : din) din_ptrs.push_back(d.empty() ? nullptr : &d);
  dparam.reserve(params.size());
  for (auto& p : params) {
    dparam.emplace_back(p.shape(), dtype::f64);
    std::fill_n(dparam.back().f64(), dparam.back().numel(), start);
  }
  for (auto& d : dparam) dparam_ptrs.push_back(&d);
  std::vector<const tensor*> p_ptrs;
  for (auto& t : params) p_ptrs.push_back(&t);
  const backward_inputs held(o, inputs);
  o.backward({held.ptrs, p_ptrs, &r, &saved, din_ptrs, dparam_ptrs});

  gradcheck_result res;
  auto check = [&](tensor& x, const tensor& analytic, const std::string& name) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      double keep = x.f64()[i];
      x.f64()[i] = keep + eps;
      double lp = loss(inputs, params);
      x.f64()[i] = keep - eps;
      double lm = loss(inputs, params);
      x.f64()[i] = keep;
      double num = (lp - lm) / (2 * eps);
      double ana = analytic.f64()[i] - start;
      double err = std::abs(ana - num) / std::max(1e-3, std::abs(ana) + std::abs(num));
      if (err > res.max_error) {
        res.max_error = err;
        res.where = name + "[" + std::to_string(i) + "] analytic " + std::to_string(ana) + " numeric " +
                    std::to_string(num);
      }
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!din[i].empty()) check(inputs[i], din[i], "input" + std::to_string(i));
  for (size_t i = 0; i < params.size(); ++i) check(params[i], dparam[i], "param" + std::to_string(i));
  return res;
}

/// Forward in f32 must agree with forward in f64 (the training path is the f32 instantiation).
inline double f32_vs_f64_forward(const op& o, const std::vector<tensor>& inputs, const std::vector<tensor>& params) {
  std::vector<tensor> saved64, saved32;
  tensor y64 = run_forward(o, inputs, params, &saved64);
  std::vector<tensor> in32, p32;
  for (auto& t : inputs) in32.push_back(t.type() == dtype::f64 ? t.to(dtype::f32) : t);
  for (auto& t : params) p32.push_back(t.to(dtype::f32));
  int64_t unwritten = 0;
  tensor y32 = forward_poisoned(o, in32, p32, &saved32, dtype::f32, unwritten);
  if (unwritten) return std::numeric_limits<double>::infinity();
  return max_rel_diff(y32, y64);
}

}  // namespace fusion::test
