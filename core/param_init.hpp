// Deterministic parameter initialisation: every parameter's values depend only on the run seed
// and the parameter's full name, so a node initialises identically wherever it is placed.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.hpp"
#include "ops/op.hpp"

namespace fusion {

/// Fills `t` (f32, shape spec.shape) according to spec.init, seeded by (seed, key).
void init_param(tensor& t, const param_spec& spec, uint64_t seed, const std::string& key);

/// A buffer's starting value as its spec says (zeros or ones): f32, on the CPU.
tensor init_buffer(const buffer_spec& spec);

/// 64-bit FNV-1a of a string, the seed mixer used for parameter keys.
uint64_t fnv1a64(const std::string& s);

}  // namespace fusion
