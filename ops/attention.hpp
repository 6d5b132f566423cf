// Multi-head self-attention (GPT-2 / llm.c attention, before the output projection). The CPU
// kernels, defined and instantiated for T = float and double in ops/cpu/attention.cpp.
//
// Shapes: B batch, T time, C channels, NH heads, HS = C / NH head size.
//   in qkv (B, T, 3C) = [q | k | v] along the last dim, head h of q at columns [h*HS, (h+1)*HS)
//   out (B, T, C): the heads' outputs concatenated, out[b, t, h*HS + d]
//   saved P (B, NH, T, T): softmax probabilities; with the causal mask P[.., t, j] = 0 for j > t
// Per (b, h):  S = Q K^T / sqrt(HS) (masked),  P = softmax_rows(S),  O = P V.
// Forward overwrites out and att; backward ACCUMULATES (+=) into dqkv.
// The kernels assume C % NH == 0 and that T*T and 3C fit BLAS's int (the op checks both).
#pragma once

#include <cstdint>

namespace fusion::cpu {

/// out (B,T,C) = attention of qkv (B,T,3C) with NH heads; writes probabilities to att (B,NH,T,T).
template <class T>
void attention_forward_cpu(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                           bool causal);

/// Accumulates (+=) dqkv (B,T,3C) from dout (B,T,C), the input qkv and the saved probabilities att.
template <class T>
void attention_backward_cpu(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t T_,
                            int64_t C, int64_t NH, bool causal);

}  // namespace fusion::cpu
