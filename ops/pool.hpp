// Pooling over image planes (max, average, global average) and flatten. The CPU kernels, defined
// and instantiated for T = float and double in ops/cpu/pool.cpp, which also holds the ops
// max_pool2d, avg_pool2d, global_avg_pool and flatten.
//
// Shapes: in (B, C, H, W) viewed as P = B * C planes of H x W; kernel k x k (square), stride s,
// padding p on every side (p <= k / 2, as in PyTorch, so every window holds a real pixel);
// out (B, C, Ho, Wo) with Ho = (H + 2p - k) / s + 1, Wo = (W + 2p - k) / s + 1.
//   max:  padding counts as -infinity; argmax (B, C, Ho, Wo) i32 holds the flat index (h * W + w,
//         within the plane) of each output's maximum: the FIRST one in row-major window order,
//         except that a NaN beats any number (the first NaN of the window, so NaNs propagate).
//   avg:  the window sum divided by k * k always, padding included (PyTorch's
//         count_include_pad=True).
//   global average: (B, C, H, W) -> (B, C), the mean of each plane.
//   flatten: (B, d1, d2, ...) -> (B, d1 * d2 * ...), the same elements in the same order.
// Forward kernels overwrite their outputs; backward kernels ACCUMULATE (+=) into `din`.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// Geometry of one 2-D pooling call, shared by the max and average kernels.
struct pool2d_geometry {
  int64_t planes;  ///< B * C
  int64_t H, W;    ///< input plane
  int64_t k, s, p; ///< kernel, stride, padding
  int64_t Ho, Wo;  ///< output plane
};

/// out = max over each window; argmax = flat index of that maximum within its input plane.
template <class T>
void max_pool2d_forward_cpu(T* out, int32_t* argmax, const T* in, const pool2d_geometry& g);

/// din[argmax] += dout for every output element (overlapping windows add up).
template <class T>
void max_pool2d_backward_cpu(T* din, const T* dout, const int32_t* argmax, const pool2d_geometry& g);

/// out = sum over each window of the real pixels / (k * k).
template <class T>
void avg_pool2d_forward_cpu(T* out, const T* in, const pool2d_geometry& g);

/// din += dout / (k * k) over every real pixel of each output's window.
template <class T>
void avg_pool2d_backward_cpu(T* din, const T* dout, const pool2d_geometry& g);

/// out[plane] = mean of the plane's HW values.
template <class T>
void global_avg_pool_forward_cpu(T* out, const T* in, int64_t planes, int64_t HW);

/// din[plane, i] += dout[plane] / HW.
template <class T>
void global_avg_pool_backward_cpu(T* din, const T* dout, int64_t planes, int64_t HW);

}  // namespace fusion::cpu
