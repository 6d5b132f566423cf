// Layer normalisation over the last dimension (GPT-2 / llm.c layernorm). The CPU kernels, defined
// and instantiated for T = float and double in ops/cpu/layernorm.cpp.
//
// Shapes: in (..., C) viewed as (rows, C) with rows = numel / C; weight (C), bias (C);
// out like in; saved mean (rows) and rstd (rows), the per-row statistics backward reuses.
//   out = (in - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps), var biased (/C).
// Forward overwrites out, mean and rstd; backward ACCUMULATES (+=) into its gradients.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// Normalises each of `rows` rows of length C; writes out, and mean/rstd per row.
template <class T>
void layernorm_forward_cpu(T* out, T* mean, T* rstd, const T* in, const T* w, const T* b,
                           int64_t rows, int64_t C, T eps);

/// Accumulates (+=) the gradients of in (rows, C), weight (C) and bias (C) from dout (rows, C),
/// the input, the weight and the mean/rstd saved by forward; any of din/dw/db may be null.
template <class T>
void layernorm_backward_cpu(T* din, T* dw, T* db, const T* dout, const T* in, const T* w,
                            const T* mean, const T* rstd, int64_t rows, int64_t C);

}  // namespace fusion::cpu
