// Token and position embeddings (GPT-2 wte / wpe, llm.c encoder split in two ops): the CPU
// kernels, defined and instantiated for T = float and double in ops/cpu/embedding.cpp.
//
// Shape legend: B batch, T time, C channels, V vocabulary, L max_len (rows of the position table).
//   token_embedding:    ids (B,T) i32, weight (V,C)        -> out (B,T,C) = weight[ids]
//   position_embedding: in (B,T,C),    weight (L,C), T<=L  -> out[b,t,:] = in[b,t,:] + weight[t,:]
// Forward kernels overwrite `out`; backward kernels ACCUMULATE (+=) into their gradients.
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out[n,:] = weight[ids[n],:] for n < N (N = B*T); throws op_error on an id outside [0, V).
template <class T>
void token_embedding_forward_cpu(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C, int64_t V);

/// dweight[ids[n],:] += dout[n,:]; a repeated id accumulates every occurrence.
/// Throws op_error on an id outside [0, V).
template <class T>
void token_embedding_backward_cpu(T* dweight, const int32_t* ids, const T* dout, int64_t N, int64_t C, int64_t V);

/// out[b,t,:] = in[b,t,:] + weight[t,:]; `Tn` is T (only weight rows 0..T-1 are read).
template <class T>
void position_embedding_forward_cpu(T* out, const T* in, const T* weight, int64_t B, int64_t Tn, int64_t C);

/// din[b,t,:] += dout[b,t,:] (if din); dweight[t,:] += sum_b dout[b,t,:] (if dweight).
/// Either of din, dweight may be null (no gradient wanted).
template <class T>
void position_embedding_backward_cpu(T* din, T* dweight, const T* dout, int64_t B, int64_t Tn, int64_t C);

}  // namespace fusion::cpu
