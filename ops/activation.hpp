// Elementwise activations: GELU (tanh approximation, as GPT-2 / PyTorch approximate='tanh') and
// ReLU. The CPU kernels, defined and instantiated for T = float and double in ops/cpu/activation.cpp.
//
// Shape legend: any shape; n = number of elements. out has the input's shape.
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu(x) = max(x, 0)
// Forward kernels overwrite `out`; backward kernels ACCUMULATE (+=) into `din`. Backward takes
// the forward input `in`, not the output.
// Precision: the float GELU uses a rational tanh approximation (absolute error ~2e-7); the double
// path uses std::tanh, so float results can differ from a libm reference in the last bits.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out[i] = gelu(in[i]).
template <class T>
void gelu_forward_cpu(T* out, const T* in, int64_t n);

/// din[i] += gelu'(in[i]) * dout[i]; recomputes tanh instead of saving it (one tensor less to keep).
template <class T>
void gelu_backward_cpu(T* din, const T* in, const T* dout, int64_t n);

/// out[i] = max(in[i], 0).
template <class T>
void relu_forward_cpu(T* out, const T* in, int64_t n);

/// din[i] += in[i] > 0 ? dout[i] : 0 (the subgradient at 0 is taken as 0, like PyTorch).
template <class T>
void relu_backward_cpu(T* din, const T* in, const T* dout, int64_t n);

}  // namespace fusion::cpu
