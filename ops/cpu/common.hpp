// Small helpers shared by the CPU op classes: dtype dispatch, argument checks, BLAS sizes and
// the byte unit of the cost model. Header-only; every check throws fusion::op_error with a
// message that starts with the op kind ("linear: ...") so the graph loader can add the place.
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <string>

#include "ops/op.hpp"

namespace fusion::cpu {

/// Bytes per element assumed by cost(): training runs in f32 and token ids are i32.
inline constexpr double cost_elem_bytes = 4.0;

/// Calls `f(T{})` with T = float for f32 and T = double for f64 (use `decltype(tag)` inside);
/// throws op_error naming `who` for any other dtype.
template <class F>
decltype(auto) dispatch_float(dtype t, const char* who, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    default: break;
  }
  throw op_error(std::string(who) + ": unsupported element type " + to_string(t) + " (expects f32 or f64)");
}

/// Runs `f()` and prefixes any op_error it throws with "who: " (attr_map errors do not name the op).
template <class F>
decltype(auto) with_op_name(const char* who, F&& f) {
  try {
    return f();
  } catch (const op_error& e) {
    throw op_error(std::string(who) + ": " + e.what());
  }
}

/// Required integer attribute that must be > 0.
inline int64_t positive_attr(const attr_map& attrs, const char* who, const char* key) {
  int64_t v = with_op_name(who, [&] { return attrs.get_int(key); });
  if (v <= 0)
    throw op_error(std::string(who) + ": attribute '" + key + "' must be positive, got " + std::to_string(v));
  return v;
}

/// Checks the number of inputs (and that shapes and dtypes come in pairs).
inline void check_arity(const char* who, std::span<const shape_t> shapes, std::span<const dtype> types,
                        size_t n) {
  if (shapes.size() != n)
    throw op_error(std::string(who) + ": expects " + std::to_string(n) + " input" + (n == 1 ? "" : "s") +
                   ", got " + std::to_string(shapes.size()));
  if (types.size() != shapes.size())
    throw op_error(std::string(who) + ": " + std::to_string(shapes.size()) + " input shapes but " +
                   std::to_string(types.size()) + " input types");
}

/// Input `i` must be floating (f32 or f64).
inline void check_float_input(const char* who, std::span<const dtype> types, size_t i) {
  if (types[i] != dtype::f32 && types[i] != dtype::f64)
    throw op_error(std::string(who) + ": input " + std::to_string(i) + " must be f32 or f64, got " +
                   to_string(types[i]));
}

/// Input `i` must hold i32 (token ids, targets).
inline void check_int_input(const char* who, std::span<const dtype> types, size_t i) {
  if (types[i] != dtype::i32)
    throw op_error(std::string(who) + ": input " + std::to_string(i) + " must be i32 (token ids), got " +
                   to_string(types[i]));
}

/// Floating inputs `i` and `j` must share one dtype (one call runs in one precision).
inline void check_same_dtype(const char* who, std::span<const dtype> types, size_t i, size_t j) {
  if (types[i] != types[j])
    throw op_error(std::string(who) + ": inputs " + std::to_string(i) + " and " + std::to_string(j) +
                   " differ in element type (" + to_string(types[i]) + " vs " + to_string(types[j]) + ")");
}

/// No negative dimension in input `i`.
inline void check_dims(const char* who, const shape_t& s, size_t i) {
  for (auto d : s)
    if (d < 0)
      throw op_error(std::string(who) + ": input " + std::to_string(i) + " has a negative dimension: " +
                     to_string(s));
}

/// Input `i` must have exactly `rank` dimensions; `legend` reads e.g. "(B, T, C)".
inline void check_rank(const char* who, const shape_t& s, size_t i, size_t rank, const char* legend) {
  check_dims(who, s, i);
  if (s.size() != rank)
    throw op_error(std::string(who) + ": input " + std::to_string(i) + " must have rank " +
                   std::to_string(rank) + " " + legend + ", got shape " + to_string(s));
}

/// Input `i` must have at least `min_rank` dimensions.
inline void check_min_rank(const char* who, const shape_t& s, size_t i, size_t min_rank, const char* legend) {
  check_dims(who, s, i);
  if (s.size() < min_rank)
    throw op_error(std::string(who) + ": input " + std::to_string(i) + " must have rank >= " +
                   std::to_string(min_rank) + " " + legend + ", got shape " + to_string(s));
}

/// Product of all dimensions but the last: the number of rows of a (..., K) tensor.
inline int64_t leading_rows(const shape_t& s) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}

/// Narrows a size to BLAS's int; op_error when it does not fit.
inline int blas_int(int64_t v, const char* who) {
  if (v < 0 || v > INT_MAX)
    throw op_error(std::string(who) + ": matrix dimension " + std::to_string(v) + " exceeds the BLAS int range");
  return static_cast<int>(v);
}

/// cost() gets the same input shapes as infer_shape; checks their count before indexing.
inline void check_cost_call(const char* who, std::span<const shape_t> shapes, size_t n) {
  if (shapes.size() != n)
    throw op_error(std::string(who) + ": cost() expects " + std::to_string(n) + " input shape" +
                   (n == 1 ? "" : "s") + ", got " + std::to_string(shapes.size()));
}

/// Checks the tensor counts of a forward call against what the op expects, so a mis-wired call
/// fails with a message instead of reading past a span.
inline void check_forward_call(const char* who, const forward_args& a, size_t n_inputs, size_t n_params) {
  if (a.inputs.size() != n_inputs || a.params.size() != n_params || a.output == nullptr)
    throw op_error(std::string(who) + ": forward called with " + std::to_string(a.inputs.size()) +
                   " inputs, " + std::to_string(a.params.size()) + " params" +
                   (a.output ? "" : " and no output") + "; expects " + std::to_string(n_inputs) + " inputs, " +
                   std::to_string(n_params) + " params and an output");
}

/// Same for a backward call; gradient spans must match inputs and params one to one.
inline void check_backward_call(const char* who, const backward_args& a, size_t n_inputs, size_t n_params) {
  if (a.inputs.size() != n_inputs || a.params.size() != n_params || a.input_grads.size() != n_inputs ||
      a.param_grads.size() != n_params || a.output_grad == nullptr)
    throw op_error(std::string(who) + ": backward called with " + std::to_string(a.inputs.size()) +
                   " inputs, " + std::to_string(a.input_grads.size()) + " input grads, " +
                   std::to_string(a.params.size()) + " params, " + std::to_string(a.param_grads.size()) +
                   " param grads" + (a.output_grad ? "" : " and no output grad") + "; expects " +
                   std::to_string(n_inputs) + " inputs and " + std::to_string(n_params) + " params");
}

/// Throws op_error "who: what has dtype X, expected Y" unless `t` has dtype `want` (a
/// mis-typed tensor would otherwise surface as tensor's std::logic_error).
inline void check_tensor_dtype(const char* who, const char* what, const tensor* t, dtype want) {
  if (t->type() != want)
    throw op_error(std::string(who) + ": " + what + " has dtype " + to_string(t->type()) + ", expected " +
                   to_string(want));
}

/// A tensor handed to forward/backward must have the shape infer_shape/params promised;
/// `what` names it ("param weight", "output grad").
inline void check_tensor_shape(const char* who, const char* what, const tensor* t, const shape_t& want) {
  if (t == nullptr || t->shape() != want)
    throw op_error(std::string(who) + ": " + what + " has shape " + (t ? to_string(t->shape()) : "(none)") +
                   ", expected " + to_string(want));
}

}  // namespace fusion::cpu
