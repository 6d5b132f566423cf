// Batched matrix product of two activations: CPU kernels (contract in ops/matmul.hpp) and op.
//
// One gemm per batch matrix.
#include "ops/matmul.hpp"

#include <algorithm>
#include <string>

#include "ops/cpu/blas.hpp"
#include "ops/cpu/common.hpp"
#include "ops/op_kinds.hpp"

namespace fusion::cpu {

constexpr const char* matmul_name = "matmul";

template <class T>
void matmul_forward_cpu(T* out, const T* a, const T* b, int64_t Z, int64_t M, int64_t K, int64_t N,
                        bool transpose_b) {
  if (Z == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // an empty inner product is 0; BLAS rejects leading dimension 0
    std::fill_n(out, Z * M * N, T(0));
    return;
  }
  const int m = blas_int(M, matmul_name), k = blas_int(K, matmul_name), n = blas_int(N, matmul_name);
  for (int64_t z = 0; z < Z; ++z)
    gemm(false, transpose_b, m, n, k, T(1), a + z * M * K, k, b + z * K * N, transpose_b ? k : n, T(0),
         out + z * M * N, n);
}

template <class T>
void matmul_backward_cpu(T* da, T* db, const T* dout, const T* a, const T* b, int64_t Z, int64_t M, int64_t K,
                         int64_t N, bool transpose_b) {
  if (Z == 0 || M == 0 || N == 0 || K == 0) return;  // some gradient is empty or zero
  const int m = blas_int(M, matmul_name), k = blas_int(K, matmul_name), n = blas_int(N, matmul_name);
  for (int64_t z = 0; z < Z; ++z) {
    const T* dz = dout + z * M * N;
    const T* az = a + z * M * K;
    const T* bz = b + z * K * N;
    if (da) {
      // (M,N) x (K,N)^T when b is (K,N); (M,N) x (N,K) when b is (N,K).
      gemm(false, !transpose_b, m, k, n, T(1), dz, n, bz, transpose_b ? k : n, T(1), da + z * M * K, k);
    }
    if (db) {
      if (transpose_b)
        gemm(true, false, n, k, m, T(1), dz, n, az, k, T(1), db + z * K * N, k);  // (N,K) += dout^T a
      else
        gemm(true, false, k, n, m, T(1), az, k, dz, n, T(1), db + z * K * N, n);  // (K,N) += a^T dout
    }
  }
}

template void matmul_forward_cpu<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                        bool);
template void matmul_forward_cpu<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                         bool);
template void matmul_backward_cpu<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                         int64_t, int64_t, bool);
template void matmul_backward_cpu<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                          int64_t, int64_t, int64_t, bool);

namespace {

/// attrs: transpose_b (default false).
class matmul_op final : public op {
 public:
  explicit matmul_op(const attr_map& attrs)
      : transpose_b_(with_op_name(matmul_name, [&] { return attrs.get_bool("transpose_b", false); })) {}

  const char* kind() const override { return matmul_name; }
  int arity() const override { return 2; }

  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype> types) const override {
    check_arity(matmul_name, in, types, 2);
    check_min_rank(matmul_name, in[0], 0, 2, "(..., M, K)");
    check_min_rank(matmul_name, in[1], 1, 2, transpose_b_ ? "(..., N, K)" : "(..., K, N)");
    check_float_input(matmul_name, types, 0);
    check_float_input(matmul_name, types, 1);
    check_same_dtype(matmul_name, types, 0, 1);
    return out_shape(in[0], in[1]);
  }

  void forward(const forward_args& a) const override {
    check_forward_call(matmul_name, a, 2, 0);
    const tensor& x = *a.inputs[0];
    const tensor& y = *a.inputs[1];
    const dims d = dims_of(x.shape(), y.shape());
    check_tensor_shape(matmul_name, "output", a.output, out_shape(x.shape(), y.shape()));
    dispatch_float(a.output->type(), matmul_name, [&](auto tag) {
      using T = decltype(tag);
      matmul_forward_cpu(a.output->data<T>(), x.data<T>(), y.data<T>(), d.Z, d.M, d.K, d.N, transpose_b_);
    });
  }

  void backward(const backward_args& a) const override {
    check_backward_call(matmul_name, a, 2, 0);
    const tensor& x = *a.inputs[0];
    const tensor& y = *a.inputs[1];
    const dims d = dims_of(x.shape(), y.shape());
    check_tensor_shape(matmul_name, "output grad", a.output_grad, out_shape(x.shape(), y.shape()));
    tensor* dx = a.input_grads[0];
    tensor* dy = a.input_grads[1];
    if (dx) check_tensor_shape(matmul_name, "input 0 grad", dx, x.shape());
    if (dy) check_tensor_shape(matmul_name, "input 1 grad", dy, y.shape());
    dispatch_float(a.output_grad->type(), matmul_name, [&](auto tag) {
      using T = decltype(tag);
      matmul_backward_cpu(dx ? dx->data<T>() : nullptr, dy ? dy->data<T>() : nullptr, a.output_grad->data<T>(),
                          x.data<T>(), y.data<T>(), d.Z, d.M, d.K, d.N, transpose_b_);
    });
  }

  /// Forward 2*Z*M*N*K; backward 4*Z*M*N*K (one gemm per input gradient).
  op_cost cost(std::span<const shape_t> in) const override {
    check_cost_call(matmul_name, in, 2);
    const dims d = dims_of(in[0], in[1]);
    const double Z = static_cast<double>(d.Z), M = static_cast<double>(d.M), K = static_cast<double>(d.K),
                 N = static_cast<double>(d.N);
    op_cost c;
    c.flops_forward = 2 * Z * M * N * K;
    c.flops_backward = 4 * Z * M * N * K;
    c.output_bytes = Z * M * N * cost_elem_bytes;
    c.bytes_forward = Z * (M * K + K * N + M * N) * cost_elem_bytes;
    // Reads a, b, dout; read-modify-writes da and db.
    c.bytes_backward = Z * (3 * M * K + 3 * K * N + M * N) * cost_elem_bytes;
    return c;
  }

 private:
  struct dims {
    int64_t Z, M, K, N;
  };

  /// Validates the pair of shapes and returns the batch/matrix sizes.
  dims dims_of(const shape_t& a, const shape_t& b) const {
    if (a.size() < 2 || b.size() < 2)
      throw op_error(std::string(matmul_name) + ": inputs must have rank >= 2, got " + to_string(a) + " and " +
                     to_string(b));
    if (a.size() != b.size() || !std::equal(a.begin(), a.end() - 2, b.begin()))
      throw op_error(std::string(matmul_name) + ": leading batch dimensions differ: " + to_string(a) + " vs " +
                     to_string(b));
    const int64_t M = a[a.size() - 2], K = a.back();
    const int64_t bk = transpose_b_ ? b.back() : b[b.size() - 2];
    const int64_t N = transpose_b_ ? b[b.size() - 2] : b.back();
    if (bk != K)
      throw op_error(std::string(matmul_name) + ": inner dimensions differ: input 0 " + to_string(a) + " has K=" +
                     std::to_string(K) + " but input 1 " + to_string(b) + " has K=" + std::to_string(bk) +
                     (transpose_b_ ? " (transpose_b: input 1 is (..., N, K))" : " (input 1 is (..., K, N))"));
    int64_t Z = 1;
    for (size_t i = 0; i + 2 < a.size(); ++i) Z *= a[i];
    return {Z, M, K, N};
  }

  shape_t out_shape(const shape_t& a, const shape_t& b) const {
    const dims d = dims_of(a, b);
    shape_t out(a.begin(), a.end() - 2);
    out.push_back(d.M);
    out.push_back(d.N);
    return out;
  }

  bool transpose_b_;
};

}  // namespace

}  // namespace fusion::cpu

namespace fusion {

std::unique_ptr<op> make_matmul_cpu(const attr_map& attrs) { return std::make_unique<cpu::matmul_op>(attrs); }

}  // namespace fusion
