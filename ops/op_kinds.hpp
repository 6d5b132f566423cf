// The op kinds, listed once. FUSION_OP_KINDS(X) calls X(kind, family, attributes...) per kind,
// sorted by kind:
//   kind        the name model files use (`op: "conv2d"`), an identifier;
//   family      the stem of the files that hold the kind's code: ops/<family>.hpp (kernel
//               declarations), ops/cpu/<family>.cpp (CPU kernels and make_<kind>_cpu),
//               ops/cuda/<family>.cu (CUDA kernels and make_<kind>_cuda); several kinds may
//               share a family (activation: gelu and relu);
//   attributes  every attribute the factory reads (the loader rejects any other name), as
//               string literals; none for an op without attributes.
// Everything per kind is generated from this list: the CPU registry (ops/registry.cpp), the CUDA
// op table (ops/cuda/backend.cu), the factory declarations below, and one parity test per kind
// (tests/cuda/parity.cpp), which fails for a kind without a case. docs/architecture.md, "How to
// add an op kind", lists the files a new kind touches.
#pragma once

#include <memory>

#include "ops/op.hpp"

// clang-format off
#define FUSION_OP_KINDS(X)                                                                         \
  X(add, add)                                                                                      \
  X(attention, attention, "heads", "causal")                                                       \
  X(avg_pool2d, pool, "kernel", "stride", "padding")                                               \
  X(batchnorm2d, batchnorm, "eps", "momentum")                                                     \
  X(conv2d, conv, "out", "kernel", "stride", "padding", "dilation", "groups", "bias", "init_std")  \
  X(cross_entropy, cross_entropy)                                                                  \
  X(flatten, pool)                                                                                 \
  X(gelu, activation)                                                                              \
  X(global_avg_pool, pool)                                                                         \
  X(identity, add)                                                                                 \
  X(layernorm, layernorm, "eps")                                                                   \
  X(linear, linear, "out", "in", "bias", "init_std")                                               \
  X(matmul, matmul, "transpose_b")                                                                 \
  X(max_pool2d, pool, "kernel", "stride", "padding")                                               \
  X(position_embedding, embedding, "max_len", "dim")                                               \
  X(relu, activation)                                                                              \
  X(token_embedding, embedding, "vocab", "dim")
// clang-format on

namespace fusion {

/// The CPU factory of each kind, make_<kind>_cpu, defined in ops/cpu/<family>.cpp: the op with
/// these attributes, or op_error for a bad one.
#define FUSION_DECLARE_CPU_FACTORY(kind, family, ...) std::unique_ptr<op> make_##kind##_cpu(const attr_map& attrs);
FUSION_OP_KINDS(FUSION_DECLARE_CPU_FACTORY)
#undef FUSION_DECLARE_CPU_FACTORY

}  // namespace fusion

namespace fusion::cuda {

/// The CUDA factory of each kind, make_<kind>_cuda, defined in ops/cuda/<family>.cu (compiled
/// only with FUSION_HAVE_CUDA; reached through cuda::make_op, ops/cuda/cuda_backend.hpp).
#define FUSION_DECLARE_CUDA_FACTORY(kind, family, ...) std::unique_ptr<op> make_##kind##_cuda(const attr_map& attrs);
FUSION_OP_KINDS(FUSION_DECLARE_CUDA_FACTORY)
#undef FUSION_DECLARE_CUDA_FACTORY

}  // namespace fusion::cuda
