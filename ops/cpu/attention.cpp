// Multi-head self-attention: CPU kernels (contract in ops/attention.hpp) and op.
//
// Q, K and V are read in place through gemm leading dimensions (lda = 3C), so nothing is gathered.
#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/blas.hpp"
#include "ops/cpu/common.hpp"
#include "ops/cpu/vec_math.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

namespace {

// Query rows are processed in blocks so that, with the causal mask, each block only multiplies
// against the keys it can see (columns [0, r1)): about half the GEMM work for long T, while
// blocks stay big enough for BLAS to run near peak.
constexpr int64_t attention_row_block = 64;

// Largest saved probability tensor (B, heads, T, T): the model loader's per-tensor limit
// (graph_max_tensor_elements in core/graph.hpp, which ops/ cannot include), so a long context
// is refused at load time with the node's line instead of by std::bad_alloc in the first forward.
constexpr int64_t attention_max_probs = int64_t{1} << 32;

// Causal softmax of one score row in place over columns [0, n); columns [n, T) become 0.
template <class T>
void softmax_row(T* row, int64_t n, int64_t T_) {
  const T inv = T(1) / exp_shift_sum(row, row, n, row_max(row, n));
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + T_, T(0));
}

}  // namespace

template <class T>
void attention_forward_cpu(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                           bool causal) {
  const int64_t HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
  const int64_t blk = causal ? attention_row_block : T_;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * T_ * C3 + h * HS;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* p = att + (b * NH + h) * T_ * T_;
      T* o = out + b * T_ * C + h * HS;
      for (int64_t r0 = 0; r0 < T_; r0 += blk) {
        const int64_t r1 = std::min(T_, r0 + blk), m = r1 - r0, ncol = causal ? r1 : T_;
        gemm(false, true, int(m), int(ncol), int(HS), scale, q + r0 * C3, int(C3), k, int(C3), T(0),
             p + r0 * T_, int(T_));
        for (int64_t t = r0; t < r1; ++t) softmax_row(p + t * T_, causal ? t + 1 : T_, T_);
        gemm(false, false, int(m), int(HS), int(ncol), T(1), p + r0 * T_, int(T_), v, int(C3), T(0),
             o + r0 * C, int(C));
      }
    }
  }
}

template <class T>
void attention_backward_cpu(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t T_,
                            int64_t C, int64_t NH, bool causal) {
  const int64_t HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
  const int64_t blk = causal ? attention_row_block : T_;
  std::vector<T> ds(static_cast<size_t>(blk * T_));  // dP, then dS, for one row block
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * T_ * C3 + h * HS;
      const T* k = q + C;
      const T* v = q + 2 * C;
      const T* p = att + (b * NH + h) * T_ * T_;
      const T* dout_h = dout + b * T_ * C + h * HS;
      T* dq = dqkv + b * T_ * C3 + h * HS;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      for (int64_t r0 = 0; r0 < T_; r0 += blk) {
        const int64_t r1 = std::min(T_, r0 + blk), m = r1 - r0, ncol = causal ? r1 : T_;
        const T* pb = p + r0 * T_;
        // dP = dO V^T and dV += P^T dO.
        gemm(false, true, int(m), int(ncol), int(HS), T(1), dout_h + r0 * C, int(C), v, int(C3), T(0),
             ds.data(), int(T_));
        gemm(true, false, int(ncol), int(HS), int(m), T(1), pb, int(T_), dout_h + r0 * C, int(C), T(1), dv,
             int(C3));
        // Softmax backward: dS = P .* (dP - rowsum(P .* dP)); masked entries have P = 0, so dS = 0.
        for (int64_t t = r0; t < r1; ++t) {
          const T* pr = p + t * T_;
          T* dr = ds.data() + (t - r0) * T_;
          const int64_t n = causal ? t + 1 : T_;
          const T dot = lane_sum<T>(n, [&](int64_t j) { return pr[j] * dr[j]; });
          for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
          std::fill(dr + n, dr + ncol, T(0));
        }
        // S = scale Q K^T:  dQ += scale dS K,  dK += scale dS^T Q.
        gemm(false, false, int(m), int(HS), int(ncol), scale, ds.data(), int(T_), k, int(C3), T(1),
             dq + r0 * C3, int(C3));
        gemm(true, false, int(ncol), int(HS), int(m), scale, ds.data(), int(T_), q + r0 * C3, int(C3), T(1), dk,
             int(C3));
      }
    }
  }
}

template void attention_forward_cpu<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                           bool);
template void attention_forward_cpu<double>(double*, double*, const double*, int64_t, int64_t, int64_t,
                                            int64_t, bool);
template void attention_backward_cpu<float>(float*, const float*, const float*, const float*, int64_t,
                                            int64_t, int64_t, int64_t, bool);
template void attention_backward_cpu<double>(double*, const double*, const double*, const double*, int64_t,
                                             int64_t, int64_t, int64_t, bool);

}  // namespace fusion::cpu

namespace fusion {

namespace {

using namespace fusion::cpu;

constexpr const char* attention_name = "attention";

// Analytic work per attended (query, key) pair: forward QK^T and PV (2*HS each) plus softmax
// (max, subtract, exp, sum, normalise = 5); backward dP, dV, dQ, dK (2*HS each) plus softmax
// backward (dot product 2, subtract 1, multiply 1 = 4).
constexpr double attention_softmax_forward_flops = 5;
constexpr double attention_softmax_backward_flops = 4;

class attention_op final : public op {
 public:
  attention_op(int64_t heads, bool causal) : heads_(heads), causal_(causal) {}

  const char* kind() const override { return attention_name; }
  int arity() const override { return 1; }

  shape_t infer_shape(std::span<const shape_t> inputs, std::span<const dtype> types) const override {
    check_arity(attention_name, inputs, types, 1);
    check_float_input(attention_name, types, 0);
    const shape_t& s = inputs[0];
    if (s.size() != 3) throw op_error("attention: qkv must have shape (B, T, 3C), got " + to_string(s));
    for (int64_t d : s)
      if (d <= 0) throw op_error("attention: qkv shape " + to_string(s) + " has a non-positive dimension");
    if (s[2] % 3 != 0)
      throw op_error("attention: last dim of qkv " + to_string(s) + " is not divisible by 3 (expected 3C)");
    const int64_t C = s[2] / 3;
    if (C % heads_ != 0)
      throw op_error("attention: C = " + std::to_string(C) + " is not divisible by heads = " + std::to_string(heads_));
    blas_int(s[1], attention_name);  // first, so that T * T below cannot wrap around
    blas_int(s[1] * s[1], attention_name);  // one head's T x T scores go through BLAS
    blas_int(s[2], attention_name);
    int64_t rows = 0, probs = 0;
    if (__builtin_mul_overflow(s[0], heads_, &rows) || __builtin_mul_overflow(rows, s[1] * s[1], &probs) ||
        probs > attention_max_probs)
      throw op_error("attention: the saved probabilities (B, heads, T, T) = (" + std::to_string(s[0]) + ", " +
                     std::to_string(heads_) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[1]) +
                     ") would have more than 2^32 elements, the limit per tensor (use a smaller batch or context)");
    return {s[0], s[1], C};
  }

  void forward(const forward_args& a) const override {
    check_forward_call(attention_name, a, 1, 0);
    const tensor& in = checked_qkv(*a.inputs[0]);
    const int64_t B = in.dim(0), T_ = in.dim(1), C = in.dim(2) / 3;
    check_tensor_shape(attention_name, "output", a.output, {B, T_, C});
    dispatch_float(a.output->type(), attention_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(in, dtype_of<T>(), "qkv");
      a.saved->clear();
      a.saved->emplace_back(shape_t{B, heads_, T_, T_}, dtype_of<T>());
      attention_forward_cpu<T>(a.output->data<T>(), (*a.saved)[0].data<T>(), in.data<T>(), B, T_, C, heads_,
                               causal_);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(attention_name, a, 1, 0);
    const tensor& in = checked_qkv(*a.inputs[0]);
    const int64_t B = in.dim(0), T_ = in.dim(1), C = in.dim(2) / 3;
    check_tensor_shape(attention_name, "output grad", a.output_grad, {B, T_, C});
    tensor* dqkv = a.input_grads[0];
    if (dqkv == nullptr) return;  // nothing upstream wants it
    check_tensor_shape(attention_name, "input grad", dqkv, in.shape());
    if (a.saved == nullptr || a.saved->size() != 1)
      throw op_error("attention: backward without the probabilities saved by forward");
    check_tensor_shape(attention_name, "saved probabilities", &(*a.saved)[0], {B, heads_, T_, T_});
    dispatch_float(a.output_grad->type(), attention_name, [&](auto tag) {
      using T = decltype(tag);
      check_type(in, dtype_of<T>(), "qkv");
      check_type(*dqkv, dtype_of<T>(), "input grad");
      check_type((*a.saved)[0], dtype_of<T>(), "saved probabilities");
      attention_backward_cpu<T>(dqkv->data<T>(), a.output_grad->data<T>(), in.data<T>(), (*a.saved)[0].data<T>(),
                                B, T_, C, heads_, causal_);
    });
  }

  /// Per (batch, head) and attended pair: forward 4*HS + 5 flops, backward 8*HS + 4.
  op_cost cost(std::span<const shape_t> inputs) const override {
    const shape_t& s = inputs[0];
    const double B = double(s[0]), T = double(s[1]), C = double(s[2]) / 3, HS = C / double(heads_);
    const double pairs = causal_ ? T * (T + 1) / 2 : T * T, heads = B * double(heads_), f = cost_elem_bytes;
    op_cost c;
    c.flops_forward = heads * pairs * (4 * HS + attention_softmax_forward_flops);
    c.flops_backward = heads * pairs * (8 * HS + attention_softmax_backward_flops);
    c.output_bytes = B * T * C * f;
    // forward: read qkv, write out and P; backward: read qkv, dout, P, read-modify-write dqkv.
    c.bytes_forward = (B * T * 4 * C + heads * T * T) * f;
    c.bytes_backward = (B * T * 10 * C + heads * T * T) * f;
    return c;
  }

 private:
  // The same checks as at load time, on the tensor actually handed over.
  const tensor& checked_qkv(const tensor& in) const {
    const dtype t = in.type();
    infer_shape(std::span<const shape_t>(&in.shape(), 1), std::span<const dtype>(&t, 1));
    return in;
  }

  // A mis-typed tensor would otherwise surface as tensor's std::logic_error.
  static void check_type(const tensor& t, dtype want, const char* what) {
    if (t.type() != want)
      throw op_error(std::string(attention_name) + ": " + what + " has dtype " + to_string(t.type()) +
                     ", expected " + to_string(want));
  }

  int64_t heads_;
  bool causal_;
};

}  // namespace

std::unique_ptr<op> make_attention_cpu(const attr_map& attrs) {
  const int64_t heads = positive_attr(attrs, attention_name, "heads");
  const bool causal = with_op_name(attention_name, [&] { return attrs.get_bool("causal", true); });
  return std::make_unique<attention_op>(heads, causal);
}

}  // namespace fusion
