// Token and position embeddings: CPU kernels (contract in ops/embedding.hpp) and ops.
#include "ops/embedding.hpp"

#include <string>

#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

[[noreturn]] void throw_bad_id(int64_t pos, int32_t id, int64_t V) {
  throw op_error("token_embedding: token id " + std::to_string(id) + " at position " + std::to_string(pos) +
                 " is out of range [0, " + std::to_string(V) + ")");
}

}  // namespace

template <class T>
void token_embedding_forward_cpu(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    int32_t id = ids[n];
    if (id < 0 || id >= V) throw_bad_id(n, id, V);
    const T* w = weight + id * C;
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = w[c];
  }
}

template <class T>
void token_embedding_backward_cpu(T* dweight, const int32_t* ids, const T* dout, int64_t N, int64_t C, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    int32_t id = ids[n];
    if (id < 0 || id >= V) throw_bad_id(n, id, V);
    T* dw = dweight + id * C;
    const T* d = dout + n * C;
    for (int64_t c = 0; c < C; ++c) dw[c] += d[c];
  }
}

template <class T>
void position_embedding_forward_cpu(T* out, const T* in, const T* weight, int64_t B, int64_t Tn, int64_t C) {
  const int64_t row = Tn * C;  // weight rows 0..T-1 are contiguous, so each batch adds one block
  for (int64_t b = 0; b < B; ++b) {
    const T* x = in + b * row;
    T* o = out + b * row;
    for (int64_t i = 0; i < row; ++i) o[i] = x[i] + weight[i];
  }
}

template <class T>
void position_embedding_backward_cpu(T* din, T* dweight, const T* dout, int64_t B, int64_t Tn, int64_t C) {
  const int64_t row = Tn * C;
  for (int64_t b = 0; b < B; ++b) {
    const T* d = dout + b * row;
    if (din) {
      T* dx = din + b * row;
      for (int64_t i = 0; i < row; ++i) dx[i] += d[i];
    }
    if (dweight)
      for (int64_t i = 0; i < row; ++i) dweight[i] += d[i];
  }
}

template void token_embedding_forward_cpu<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t);
template void token_embedding_forward_cpu<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t);
template void token_embedding_backward_cpu<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t);
template void token_embedding_backward_cpu<double>(double*, const int32_t*, const double*, int64_t, int64_t,
                                                   int64_t);
template void position_embedding_forward_cpu<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void position_embedding_forward_cpu<double>(double*, const double*, const double*, int64_t, int64_t,
                                                     int64_t);
template void position_embedding_backward_cpu<float>(float*, float*, const float*, int64_t, int64_t, int64_t);
template void position_embedding_backward_cpu<double>(double*, double*, const double*, int64_t, int64_t, int64_t);

namespace {

constexpr const char* tok_name = "token_embedding";
constexpr const char* pos_name = "position_embedding";

/// Token embedding: attrs vocab (V), dim (C); one i32 input without gradient; param weight (V,C).
class token_embedding_op final : public op {
 public:
  explicit token_embedding_op(const attr_map& attrs)
      : vocab_(positive_attr(attrs, tok_name, "vocab")), dim_(positive_attr(attrs, tok_name, "dim")) {}

  const char* kind() const override { return tok_name; }
  int arity() const override { return 1; }
  bool input_has_grad(size_t) const override { return false; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(tok_name, in, types, 1);
    check_rank(tok_name, in[0], 0, 2, "(B, T) of token ids");
    check_int_input(tok_name, types, 0);
    return {in[0][0], in[0][1], dim_};
  }

  std::vector<param_spec> params(std::span<const shape_t>) const override {
    return {{"weight", {vocab_, dim_}, param_init::normal, 0.02f, true}};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(tok_name, a, 1, 1);
    const tensor& ids = ids_of(a.inputs[0]);
    check_tensor_shape(tok_name, "param weight", a.params[0], {vocab_, dim_});
    check_tensor_shape(tok_name, "output", a.output, {ids.dim(0), ids.dim(1), dim_});
    dispatch_float(a.output->type(), tok_name, [&](auto tag) {
      using T = decltype(tag);
      token_embedding_forward_cpu(a.output->data<T>(), ids.i32(), a.params[0]->data<T>(), ids.numel(), dim_,
                                  vocab_);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(tok_name, a, 1, 1);
    const tensor& ids = ids_of(a.inputs[0]);
    check_tensor_shape(tok_name, "output grad", a.output_grad, {ids.dim(0), ids.dim(1), dim_});
    tensor* dw = a.param_grads[0];
    if (!dw) return;
    check_tensor_shape(tok_name, "weight grad", dw, {vocab_, dim_});
    dispatch_float(a.output_grad->type(), tok_name, [&](auto tag) {
      using T = decltype(tag);
      token_embedding_backward_cpu(dw->data<T>(), ids.i32(), a.output_grad->data<T>(), ids.numel(), dim_,
                                   vocab_);
    });
  }

  /// Forward is a gather (0 FLOPs); backward adds N*C values into the table (N = B*T).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(tok_name, in, 1);
    const double N = static_cast<double>(numel_of(in[0])), C = static_cast<double>(dim_);
    op_cost c;
    c.flops_forward = 0;
    c.flops_backward = N * C;
    c.param_bytes = static_cast<double>(vocab_) * C * cost_elem_bytes;
    c.output_bytes = N * C * cost_elem_bytes;
    c.bytes_forward = (N + 2 * N * C) * cost_elem_bytes;      // ids, gathered rows, output
    c.bytes_backward = (N + 3 * N * C) * cost_elem_bytes;     // ids, dout, read+write of touched rows
    return c;
  }

 private:
  static const tensor& ids_of(const tensor* t) {
    if (t->rank() != 2 || t->type() != dtype::i32)
      throw op_error(std::string(tok_name) + ": token ids must be (B, T) i32, got " + to_string(t->type()) + " " +
                     to_string(t->shape()));
    return *t;
  }

  int64_t vocab_;
  int64_t dim_;
};

/// Position embedding: attrs max_len (L), optional dim (C); input (B,T,C); param weight (L,C).
class position_embedding_op final : public op {
 public:
  explicit position_embedding_op(const attr_map& attrs)
      : max_len_(positive_attr(attrs, pos_name, "max_len")),
        dim_(attrs.has("dim") ? positive_attr(attrs, pos_name, "dim") : -1) {}

  const char* kind() const override { return pos_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(pos_name, in, types, 1);
    check_rank(pos_name, in[0], 0, 3, "(B, T, C)");
    check_float_input(pos_name, types, 0);
    if (in[0][1] > max_len_)
      throw op_error(std::string(pos_name) + ": sequence length T=" + std::to_string(in[0][1]) +
                     " exceeds attribute max_len=" + std::to_string(max_len_));
    if (dim_ >= 0 && in[0][2] != dim_)
      throw op_error(std::string(pos_name) + ": input last dimension " + std::to_string(in[0][2]) +
                     " does not match attribute dim=" + std::to_string(dim_));
    return in[0];
  }

  std::vector<param_spec> params(std::span<const shape_t> in) const override {
    const int64_t C = in.empty() || in[0].size() != 3 ? dim_ : in[0][2];
    if (C <= 0) throw op_error(std::string(pos_name) + ": cannot size weight without a (B, T, C) input or dim");
    // GPT-2 initialises wpe with std 0.01, half of wte's.
    return {{"weight", {max_len_, C}, param_init::normal, 0.01f, true}};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(pos_name, a, 1, 1);
    const tensor& x = *a.inputs[0];
    const btc d = dims(x);
    check_tensor_shape(pos_name, "param weight", a.params[0], {max_len_, d.C});
    check_tensor_shape(pos_name, "output", a.output, x.shape());
    dispatch_float(a.output->type(), pos_name, [&](auto tag) {
      using T = decltype(tag);
      position_embedding_forward_cpu(a.output->data<T>(), x.data<T>(), a.params[0]->data<T>(), d.B, d.T, d.C);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(pos_name, a, 1, 1);
    const tensor& x = *a.inputs[0];
    const btc d = dims(x);
    check_tensor_shape(pos_name, "output grad", a.output_grad, x.shape());
    tensor* dx = a.input_grads[0];
    tensor* dw = a.param_grads[0];
    if (dx) check_tensor_shape(pos_name, "input grad", dx, x.shape());
    if (dw) check_tensor_shape(pos_name, "weight grad", dw, {max_len_, d.C});
    dispatch_float(a.output_grad->type(), pos_name, [&](auto tag) {
      using T = decltype(tag);
      position_embedding_backward_cpu(dx ? dx->data<T>() : nullptr, dw ? dw->data<T>() : nullptr,
                                      a.output_grad->data<T>(), d.B, d.T, d.C);
    });
  }

  /// Forward: B*T*C adds. Backward: B*T*C adds into the input grad and B*T*C into the weight grad.
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(pos_name, in, 1);
    const double n = static_cast<double>(numel_of(in[0]));
    const double C = in[0].size() == 3 ? static_cast<double>(in[0][2]) : 0;
    op_cost c;
    c.flops_forward = n;
    c.flops_backward = 2 * n;
    c.param_bytes = static_cast<double>(max_len_) * C * cost_elem_bytes;
    c.output_bytes = n * cost_elem_bytes;
    c.bytes_forward = 3 * n * cost_elem_bytes;   // input, table rows (re-read per batch), output
    c.bytes_backward = 5 * n * cost_elem_bytes;  // dout, read+write din, read+write dweight rows
    return c;
  }

 private:
  struct btc {
    int64_t B, T, C;
  };
  btc dims(const tensor& x) const {
    if (x.rank() != 3 || x.dim(1) > max_len_)
      throw op_error(std::string(pos_name) + ": input has shape " + to_string(x.shape()) +
                     ", expected (B, T, C) with T <= max_len=" + std::to_string(max_len_));
    return {x.dim(0), x.dim(1), x.dim(2)};
  }

  int64_t max_len_;
  int64_t dim_;  ///< -1 when not given
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_token_embedding_cpu(const attr_map& attrs) {
  return std::make_unique<cpu::token_embedding_op>(attrs);
}

std::unique_ptr<op> make_position_embedding_cpu(const attr_map& attrs) {
  return std::make_unique<cpu::position_embedding_op>(attrs);
}

}  // namespace fusion
