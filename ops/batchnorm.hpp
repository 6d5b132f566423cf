// Batch normalisation over the batch and spatial dimensions, one set of statistics per channel
// (PyTorch BatchNorm2d, also fine for (B, C) inputs). The CPU kernels, defined and instantiated
// for T = float and double in ops/cpu/batchnorm.cpp.
//
// Shapes: in (B, C, ...spatial) viewed as (B, C, S) with S = product of the spatial dimensions
// (1 for a (B, C) input); n = B * S values per channel; weight, bias (C); out like in.
// Training: per channel, mean and biased variance (/n) of the n values,
//   out = (in - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps);
// saved mean (C) and rstd (C) for backward; running statistics (C) updated like PyTorch:
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)   (unbiased)
// Evaluation: out = (in - running_mean) / sqrt(running_var + eps) * weight + bias.
// Reductions are centred (two passes) and accumulate in double for both element types.
// Forward overwrites out (and mean/rstd); backward ACCUMULATES (+=) into its gradients.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// Training-mode forward: batch statistics per channel; writes out, mean and rstd (C) and
/// updates running_mean/running_var in place (either may be null to skip the update).
/// Needs n = B * S > 1 for the unbiased variance (the op checks).
template <class T>
void batchnorm_forward_train_cpu(T* out, T* mean, T* rstd, T* running_mean, T* running_var, const T* in,
                                 const T* w, const T* b, int64_t B, int64_t C, int64_t S, T eps, T momentum);

/// Evaluation-mode forward: normalises with the running statistics, which stay untouched.
template <class T>
void batchnorm_forward_eval_cpu(T* out, const T* in, const T* w, const T* b, const T* running_mean,
                                const T* running_var, int64_t B, int64_t C, int64_t S, T eps);

/// Accumulates (+=) the gradients of in (B, C, S), weight (C) and bias (C) from dout, the input,
/// the weight and the batch mean/rstd saved by the training forward; any of din/dw/db may be null.
template <class T>
void batchnorm_backward_cpu(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, const T* mean,
                            const T* rstd, int64_t B, int64_t C, int64_t S);

}  // namespace fusion::cpu
