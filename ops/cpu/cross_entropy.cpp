// Softmax cross-entropy loss: CPU kernels (contract in ops/cross_entropy.hpp) and op.
#include "ops/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

[[noreturn]] void throw_bad_target(int32_t id, int64_t row, int64_t V) {
  throw op_error("cross_entropy: target id " + std::to_string(id) + " at position " + std::to_string(row) +
                 " is outside [0, " + std::to_string(V) + ")");
}

}  // namespace

template <class T>
T cross_entropy_forward_cpu(T* max, T* logsum, const T* logits, const int32_t* targets, int64_t rows,
                            int64_t V) {
  double total = 0;  // the sum over N rows is kept in double so f32 training loses nothing here
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = targets[r];
    if (id < 0 || id >= V) throw_bad_target(id, r, V);
    const T* x = logits + r * V;
    // Subtracting the row max keeps exp() in range whatever the logits' magnitude.
    const T mx = row_max(x, V);
    max[r] = mx;
    logsum[r] = std::log(sum_exp_shift(x, V, mx));
    total += static_cast<double>(logsum[r] + (mx - x[id]));
  }
  return static_cast<T>(total / static_cast<double>(rows));
}

template <class T>
void cross_entropy_backward_cpu(T* dlogits, T dloss, const T* logits, const int32_t* targets, const T* max,
                                const T* logsum, int64_t rows, int64_t V) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= V) throw_bad_target(targets[r], r, V);
  const T g = dloss / static_cast<T>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = targets[r];
    const T* x = logits + r * V;
    T* dx = dlogits + r * V;
    const T mx = max[r], ls = logsum[r];
    for (int64_t i = 0; i < V; ++i) dx[i] += g * exp_fast((x[i] - mx) - ls);
    dx[id] -= g;
  }
}

template <class T>
int64_t cross_entropy_correct_cpu(const T* logits, const int32_t* targets, int64_t rows, int64_t V) {
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = logits + r * V;
    // max_element returns the first maximum: ties count as a miss unless the target is first.
    correct += (std::max_element(x, x + V) - x) == targets[r];
  }
  return correct;
}

template int64_t cross_entropy_correct_cpu<float>(const float*, const int32_t*, int64_t, int64_t);
template int64_t cross_entropy_correct_cpu<double>(const double*, const int32_t*, int64_t, int64_t);
template float cross_entropy_forward_cpu<float>(float*, float*, const float*, const int32_t*, int64_t,
                                                int64_t);
template double cross_entropy_forward_cpu<double>(double*, double*, const double*, const int32_t*, int64_t,
                                                  int64_t);
template void cross_entropy_backward_cpu<float>(float*, float, const float*, const int32_t*, const float*,
                                                const float*, int64_t, int64_t);
template void cross_entropy_backward_cpu<double>(double*, double, const double*, const int32_t*,
                                                 const double*, const double*, int64_t, int64_t);

}  // namespace fusion::cpu

namespace fusion {

namespace {

using namespace fusion::cpu;

constexpr const char* cross_entropy_name = "cross_entropy";

// Analytic work per logit: forward max 1 + subtract 1 + exp 1 + sum 1 = 4; backward subtract 1 +
// exp 1 + multiply-add 2 = 4 (per-row log, target pick and one-hot subtraction are negligible).
constexpr double cross_entropy_forward_flops_per_logit = 4;
constexpr double cross_entropy_backward_flops_per_logit = 4;

class cross_entropy_op final : public op {
 public:
  const char* kind() const override { return cross_entropy_name; }
  int arity() const override { return 2; }
  bool input_has_grad(size_t i) const override { return i == 0; }

  shape_t infer_shape(std::span<const shape_t> inputs, std::span<const dtype> types) const override {
    check_arity(cross_entropy_name, inputs, types, 2);
    if (types[0] != dtype::f32 && types[0] != dtype::f64)
      throw op_error(std::string("cross_entropy: logits must be f32 or f64, got ") + to_string(types[0]));
    if (types[1] != dtype::i32)
      throw op_error(std::string("cross_entropy: targets must be i32 token ids, got ") + to_string(types[1]));
    const shape_t& l = inputs[0];
    const shape_t& t = inputs[1];
    if (l.size() < 2) throw op_error("cross_entropy: logits must have shape (B, T, V), got " + to_string(l));
    for (int64_t d : l)
      if (d <= 0) throw op_error("cross_entropy: logits shape " + to_string(l) + " has a non-positive dimension");
    const shape_t rows(l.begin(), l.end() - 1);
    if (t != rows)
      throw op_error("cross_entropy: targets shape " + to_string(t) + " does not match logits " + to_string(l) +
                     " (expected " + to_string(rows) + ")");
    return {};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(cross_entropy_name, a, 2, 0);
    // Not a structured binding: clang 14 (scripts/fuzz.sh) cannot capture one in a lambda.
    const auto sizes = checked_sizes(a.inputs);
    const int64_t rows = sizes.first, V = sizes.second;
    check_tensor_shape(cross_entropy_name, "output", a.output, {});
    dispatch_float(a.output->type(), cross_entropy_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(*a.inputs[0], dtype_of<T>(), "logits");
      const shape_t row_shape = a.inputs[1]->shape();
      tensor max(row_shape, dtype_of<T>()), logsum(row_shape, dtype_of<T>());
      a.output->data<T>()[0] = cross_entropy_forward_cpu<T>(max.data<T>(), logsum.data<T>(), a.inputs[0]->data<T>(),
                                                            a.inputs[1]->i32(), rows, V);
      a.saved->clear();
      a.saved->push_back(std::move(max));
      a.saved->push_back(std::move(logsum));
      if (a.metrics)
        a.metrics->push_back({static_cast<double>(cross_entropy_correct_cpu<T>(a.inputs[0]->data<T>(),
                                                                               a.inputs[1]->i32(), rows, V)),
                              static_cast<double>(rows)});
    });
  }

  std::vector<std::string> metric_names() const override { return {"accuracy"}; }

  void backward(const backward_args& a) const override {
    check_backward_call(cross_entropy_name, a, 2, 0);
    // Not a structured binding: clang 14 (scripts/fuzz.sh) cannot capture one in a lambda.
    const auto sizes = checked_sizes(a.inputs);
    const int64_t rows = sizes.first, V = sizes.second;
    check_tensor_shape(cross_entropy_name, "output grad", a.output_grad, {});
    tensor* dlogits = a.input_grads[0];
    if (dlogits == nullptr) return;  // nothing upstream wants it
    check_tensor_shape(cross_entropy_name, "input grad", dlogits, a.inputs[0]->shape());
    if (a.saved == nullptr || a.saved->size() != 2 || (*a.saved)[0].numel() != rows || (*a.saved)[1].numel() != rows)
      throw op_error("cross_entropy: backward without the row max and log-sum saved by forward");
    dispatch_float(a.output_grad->type(), cross_entropy_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(*a.inputs[0], dtype_of<T>(), "logits");
      check_type(*dlogits, dtype_of<T>(), "input grad");
      check_type((*a.saved)[0], dtype_of<T>(), "saved row max");
      check_type((*a.saved)[1], dtype_of<T>(), "saved row log-sum");
      cross_entropy_backward_cpu<T>(dlogits->data<T>(), a.output_grad->data<T>()[0], a.inputs[0]->data<T>(),
                                    a.inputs[1]->i32(), (*a.saved)[0].data<T>(), (*a.saved)[1].data<T>(), rows, V);
    });
  }

  /// 4 flops per logit forward and 4 backward (see the constants above).
  op_cost cost(std::span<const shape_t> inputs) const override {
    const double n = double(numel_of(inputs[0])), rows = double(numel_of(inputs[1])), f = cost_elem_bytes;
    op_cost c;
    c.flops_forward = cross_entropy_forward_flops_per_logit * n;
    c.flops_backward = cross_entropy_backward_flops_per_logit * n;
    c.output_bytes = f;
    // forward: read logits and i32 targets, write max and logsum; backward: read logits,
    // targets, max and logsum, read-modify-write dlogits.
    c.bytes_forward = (n + rows + 2 * rows) * f;
    c.bytes_backward = (3 * n + rows + 2 * rows) * f;
    return c;
  }

 private:
  // The same checks as at load time, on the tensors actually handed over; returns (rows, V).
  std::pair<int64_t, int64_t> checked_sizes(std::span<const tensor* const> inputs) const {
    const shape_t shapes[2] = {inputs[0]->shape(), inputs[1]->shape()};
    const dtype types[2] = {inputs[0]->type(), inputs[1]->type()};
    infer_shape(shapes, types);
    return {inputs[1]->numel(), inputs[0]->dim(-1)};
  }

  // A mis-typed tensor would otherwise surface as tensor's std::logic_error.
  static void check_type(const tensor& t, dtype want, const char* what) {
    if (t.type() != want)
      throw op_error(std::string(cross_entropy_name) + ": " + what + " has dtype " + to_string(t.type()) +
                     ", expected " + to_string(want));
  }
};

}  // namespace

std::unique_ptr<op> make_cross_entropy_cpu(const attr_map&) { return std::make_unique<cross_entropy_op>(); }

}  // namespace fusion
