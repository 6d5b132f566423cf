// Softmax cross-entropy loss (GPT-2 / llm.c). The CPU kernels, defined and instantiated for
// T = float and double in ops/cpu/cross_entropy.cpp.
//
// Shapes: B batch, T time, V vocabulary; N = B*T positions.
//   in logits (B, T, V) f32 (f64 in gradient checks), targets (B, T) i32 (no gradient)
//   out {} scalar: mean over the N positions of -log softmax(logits)[target]
//   saved max (B, T) and logsum (B, T): per row, m = max logit and log sum_i exp(logit_i - m), so
//   backward recomputes softmax = exp((logit - m) - logsum) instead of keeping N*V probabilities
//   alive between forward and backward. Keeping m apart from logsum (rather than their sum, the
//   log-sum-exp) leaves logit - m exact, which matters in f32 when logits are large.
// More generally logits (..., V) with targets (...) is accepted; the kernels see (rows, V).
// Backward ACCUMULATES (+=) into dlogits. Forward also reports the metric "accuracy" (correct
// predictions / rows) when the caller asks for metrics.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// Returns the mean loss over `rows` rows of V logits; writes each row's max logit and
/// log sum exp(logit - max). Throws op_error for a target outside [0, V) before reading that row.
template <class T>
T cross_entropy_forward_cpu(T* max, T* logsum, const T* logits, const int32_t* targets, int64_t rows,
                            int64_t V);

/// Number of rows whose prediction, the FIRST index of the row's largest logit, equals the
/// target (the "accuracy" metric's numerator). Targets must already be in range.
template <class T>
int64_t cross_entropy_correct_cpu(const T* logits, const int32_t* targets, int64_t rows, int64_t V);

/// Accumulates dlogits += dloss * (softmax(logits) - onehot(target)) / rows. Throws op_error
/// for a target outside [0, V) before touching dlogits.
template <class T>
void cross_entropy_backward_cpu(T* dlogits, T dloss, const T* logits, const int32_t* targets, const T* max,
                                const T* logsum, int64_t rows, int64_t V);

}  // namespace fusion::cpu
