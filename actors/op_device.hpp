// Where an op actor computes: checking a requested device before any actor is spawned, choosing
// the device of each op (a GPU run with some ops kept on the CPU), and building the per-actor
// compute state (backend, op, parameters, gradients, optimizer state) on that device.
//
// CAF-free, so the checks can run in apps before an actor system exists. Everything here throws
// std::runtime_error with a message that names the device; nothing aborts without a GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "ops/backend.hpp"
#include "ops/optim.hpp"

namespace fusion {

/// Whether this process can compute on `device`; fails saying why not, e.g. "cuda:0 requested
/// but no CUDA device is available (no GPU or no driver on this machine)". Never throws.
status device_usable(const std::string& device);

/// The comma-separated glob patterns of a `cpu-ops` option ("lm_head, h*.attn"), blanks trimmed,
/// empty entries dropped.
std::vector<std::string> split_patterns(const std::string& list);

/// The device op `op_name` runs on: "cpu" when `device` is "cpu" or when one of `cpu_ops`
/// (scheduler/placement.hpp glob_match) matches the name, `device` otherwise.
std::string device_for_op(const std::string& device, const std::vector<std::string>& cpu_ops,
                          const std::string& op_name);

/// The compute state one op actor owns, created on its device before the actor starts, so that
/// a device or allocation failure surfaces where the actor is spawned (as an exception).
struct op_compute {
  std::unique_ptr<backend> dev;          ///< the actor's device (always cpu for data inputs)
  std::unique_ptr<op> impl;              ///< null for a data input
  std::vector<param_spec> param_specs;
  std::vector<tensor> params, grads, m, v;  ///< on dev; v is empty-shaped ({0}) for SGD
  std::vector<buffer_spec> buffer_specs;
  std::vector<tensor> buffers;           ///< on dev: non-trainable state (op::buffers)
};

/// Builds the compute state of an op of kind `kind` ("input": none) with these input shapes on
/// `device`, its GEMMs computing in `gemm` there. Buffers start as their spec says (zeros or
/// ones). Parameters are initialised on the CPU (core/param_init.hpp, keyed "name/param") and
/// then uploaded, so every device starts from the same weights.
op_compute make_op_compute(const std::string& device, gemm_precision gemm, const std::string& kind,
                           const attr_map& attrs, const std::vector<shape_t>& input_shapes, const std::string& name,
                           uint64_t seed, const optim_config& optim);

/// The names of an op's state tensors in the order its actor lists them (get_state_atom,
/// export_atom): "op/param", "op/param.m", "op/param.v" per parameter, then "op/buffer"; with
/// `outer` (local steps, train.sync=local:H) then the outer state: "op/param.outer",
/// "op/param.outer_m" per parameter and "op/buffer.outer".
std::vector<std::string> state_key_names(const std::string& op_name, const std::vector<param_spec>& params,
                                         const std::vector<buffer_spec>& buffers, bool outer = false);

/// state_key_names of an op of kind `kind` ("input": none) named `op_name`, without building
/// its tensors; throws what make_op throws for an unknown kind.
std::vector<std::string> state_key_names(const std::string& op_name, const std::string& kind, const attr_map& attrs,
                                         const std::vector<shape_t>& input_shapes, bool outer = false);

/// `t` as CPU data: moved when it already is, downloaded (waiting for `dev`'s queued work)
/// otherwise. A CPU tensor is never copied here.
tensor to_host(backend& dev, tensor t);

/// Element 0 of an f32 tensor of `dev` (downloads a CUDA tensor; no copy of a CPU one).
float read_scalar(backend& dev, const tensor& t);

}  // namespace fusion
