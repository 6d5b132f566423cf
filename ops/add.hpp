// Residual add of two tensors of identical shape (no broadcasting), and identity: the fan-out
// node the model loader puts between an op and its consumers when it has several (so a tensor
// crosses a cut once, core/graph_build.cpp). The CPU kernels, defined and instantiated for
// T = float and double in ops/cpu/add.cpp.
//
// Shape legend: any shape, typically (B, T, C); n = number of elements.
//   add:      out = a + b;  da += dout;  db += dout
//   identity: out = x;      dx += dout
// Forward overwrites `out`; backward ACCUMULATES (+=) into `din`.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out[i] = a[i] + b[i].
template <class T>
void add_forward_cpu(T* out, const T* a, const T* b, int64_t n);

/// din[i] += dout[i]; called once per input that wants a gradient.
template <class T>
void add_backward_cpu(T* din, const T* dout, int64_t n);

}  // namespace fusion::cpu
