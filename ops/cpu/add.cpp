// Residual add (no broadcasting) and identity: CPU kernels (contract in ops/add.hpp) and ops.
#include "ops/add.hpp"

#include <algorithm>
#include <string>

#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

template <class T>
void add_forward_cpu(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void add_backward_cpu(T* din, const T* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) din[i] += dout[i];
}

template void add_forward_cpu<float>(float*, const float*, const float*, int64_t);
template void add_forward_cpu<double>(double*, const double*, const double*, int64_t);
template void add_backward_cpu<float>(float*, const float*, int64_t);
template void add_backward_cpu<double>(double*, const double*, int64_t);

namespace {

constexpr const char* add_name = "add";

class add_op final : public op {
 public:
  explicit add_op(const attr_map&) {}

  const char* kind() const override { return add_name; }
  int arity() const override { return 2; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(add_name, in, types, 2);
    check_dims(add_name, in[0], 0);
    check_dims(add_name, in[1], 1);
    check_float_input(add_name, types, 0);
    check_float_input(add_name, types, 1);
    check_same_dtype(add_name, types, 0, 1);
    if (in[0] != in[1])
      throw op_error(std::string(add_name) + ": input shapes differ: " + to_string(in[0]) + " vs " +
                     to_string(in[1]) + " (no broadcasting)");
    return in[0];
  }

  void forward(const forward_args& a) const override {
    check_forward_call(add_name, a, 2, 0);
    const tensor& x = *a.inputs[0];
    const tensor& y = *a.inputs[1];
    check_tensor_shape(add_name, "input 1", &y, x.shape());
    check_tensor_shape(add_name, "output", a.output, x.shape());
    dispatch_float(a.output->type(), add_name, [&](auto tag) {
      using T = decltype(tag);
      add_forward_cpu(a.output->data<T>(), x.data<T>(), y.data<T>(), x.numel());
    });
  }

  bool backward_reads_inputs() const override { return false; }

  void backward(const backward_args& a) const override {
    check_backward_call(add_name, a, 2, 0);
    const shape_t& s = a.output_grad->shape();  // the inputs' shape (their values are freed)
    dispatch_float(a.output_grad->type(), add_name, [&](auto tag) {
      using T = decltype(tag);
      for (size_t i = 0; i < 2; ++i) {
        tensor* d = a.input_grads[i];
        if (!d) continue;
        check_tensor_shape(add_name, i == 0 ? "input 0 grad" : "input 1 grad", d, s);
        add_backward_cpu(d->data<T>(), a.output_grad->data<T>(), a.output_grad->numel());
      }
    });
  }

  /// Forward n adds; backward n adds per input gradient (2n).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(add_name, in, 2);
    const double n = static_cast<double>(numel_of(in[0]));
    op_cost c;
    c.flops_forward = n;
    c.flops_backward = 2 * n;
    c.output_bytes = n * cost_elem_bytes;
    c.bytes_forward = 3 * n * cost_elem_bytes;   // read a, b; write out
    c.bytes_backward = 5 * n * cost_elem_bytes;  // read dout; read-modify-write da, db
    return c;
  }
};

constexpr const char* identity_name = "identity";

// One input, passed on unchanged; its backward hands the summed gradients of the consumers back
// in one tensor. Its cost counts the copy it makes, no FLOPs.
class identity_op final : public op {
 public:
  explicit identity_op(const attr_map&) {}

  const char* kind() const override { return identity_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(identity_name, in, types, 1);
    check_dims(identity_name, in[0], 0);
    check_float_input(identity_name, types, 0);
    return in[0];
  }

  void forward(const forward_args& a) const override {
    check_forward_call(identity_name, a, 1, 0);
    const tensor& x = *a.inputs[0];
    check_tensor_shape(identity_name, "output", a.output, x.shape());
    dispatch_float(a.output->type(), identity_name, [&](auto tag) {
      using T = decltype(tag);
      std::copy_n(x.data<T>(), x.numel(), a.output->data<T>());
    });
  }

  bool backward_reads_inputs() const override { return false; }

  void backward(const backward_args& a) const override {
    check_backward_call(identity_name, a, 1, 0);
    const shape_t& s = a.output_grad->shape();  // the input's shape (its values are freed)
    tensor* d = a.input_grads[0];
    if (!d) return;
    check_tensor_shape(identity_name, "input 0 grad", d, s);
    dispatch_float(a.output_grad->type(), identity_name, [&](auto tag) {
      using T = decltype(tag);
      add_backward_cpu(d->data<T>(), a.output_grad->data<T>(), a.output_grad->numel());
    });
  }

  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(identity_name, in, 1);
    const double n = static_cast<double>(numel_of(in[0]));
    op_cost c;
    c.output_bytes = n * cost_elem_bytes;
    c.bytes_forward = 2 * n * cost_elem_bytes;   // read x; write out
    c.bytes_backward = 3 * n * cost_elem_bytes;  // read dout; read-modify-write dx
    return c;
  }
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_add_cpu(const attr_map& attrs) { return std::make_unique<cpu::add_op>(attrs); }
std::unique_ptr<op> make_identity_cpu(const attr_map& attrs) { return std::make_unique<cpu::identity_op>(attrs); }

}  // namespace fusion
