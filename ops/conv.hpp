// 2-D convolution over NCHW images, PyTorch layout and semantics (nn.Conv2d with a square kernel,
// zero padding on all four sides). The CPU kernels, defined and instantiated for T = float and
// double in ops/cpu/conv.cpp.
//
// Shape legend: B batch, Cin/Cout input/output channels, H/W input height/width, Ho/Wo output
// height/width, k kernel size, s stride, p padding, d dilation, G groups.
//   in (B, Cin, H, W), weight (Cout, Cin/G, k, k), bias (Cout) -> out (B, Cout, Ho, Wo)
//   Ho = (H + 2p - d(k-1) - 1) / s + 1, Wo likewise.
// Output channel o of group g = o / (Cout/G) sees input channels [g Cin/G, (g+1) Cin/G).
// All buffers are dense row-major. Forward overwrites `out`; backward ACCUMULATES (+=) into every
// gradient it is given.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// Geometry of one convolution call; Ho and Wo follow from the rest (conv2d_out_size).
struct conv2d_dims {
  int64_t B, Cin, H, W;
  int64_t Cout, k, stride, pad, dilation, groups;
  int64_t Ho, Wo;
};

/// Output length along one spatial axis of input length `n`; 0 when the dilated kernel does
/// not fit into the padded input.
inline int64_t conv2d_out_size(int64_t n, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = n + 2 * pad - dilation * (k - 1) - 1;
  // C++ division truncates towards zero, so -1 / 2 + 1 would claim one output.
  return span < 0 ? 0 : span / stride + 1;
}

/// out = conv(in, weight) + bias; `bias` may be null. Throws op_error when a matrix dimension
/// of the underlying gemms exceeds the BLAS int range.
template <class T>
void conv2d_forward_cpu(T* out, const T* in, const T* weight, const T* bias, const conv2d_dims& d);

/// Accumulates (+=) the gradients of in, weight and bias from dout (B, Cout, Ho, Wo), the input
/// and the weight; dbias gets the per-channel sums of dout. Any of din, dweight, dbias may be
/// null (no gradient wanted).
template <class T>
void conv2d_backward_cpu(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                         const conv2d_dims& d);

}  // namespace fusion::cpu
