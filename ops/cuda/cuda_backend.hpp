// Entry points of the CUDA library (target fusion_cuda) for CUDA-free code: ops/backend.cpp
// and the tests. Declared only; defined in ops/cuda/*.cu, linked only when FUSION_HAVE_CUDA.
#pragma once

#include <memory>
#include <string>

#include "ops/backend.hpp"
#include "tensor/device.hpp"
#include "ops/op.hpp"

namespace fusion::cuda {

/// The hook table of CUDA tensors (cudaMallocAsync on the legacy stream, cudaMemcpy, ...).
const device_hooks* tensor_hooks() noexcept;

/// cudaGetDeviceCount, or 0 on any error (no driver, no device). Never throws.
int device_count() noexcept;

/// Backend on CUDA device `index` whose ops' GEMMs compute in `gemm`; std::runtime_error when
/// the device does not exist.
std::unique_ptr<backend> make_backend(int index, gemm_precision gemm);

/// The CUDA implementation of op `kind` (same attributes, shapes and parameters as the CPU op
/// from fusion::make_op, which it uses for everything but forward and backward).
std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs);

}  // namespace fusion::cuda
