// The operator actor: one per OP-DAG node. It owns the node's parameters, gradients, optimizer
// state and the activations saved per micro-batch, and it is the only place where an op's
// forward and backward run. It does not know whether its neighbours are local or remote.
#pragma once

#include <caf/all.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/graph.hpp"
#include "ops/optim.hpp"

namespace fusion {

/// Everything an op actor needs to know about its node, independent of the graph object
/// (so that a node can later be spawned in another process from this description alone).
struct node_spec {
  int id = -1;
  std::string name;
  std::string kind;                               ///< op kind, or "input"
  std::map<std::string, std::string> attrs;
  std::vector<shape_t> input_shapes;              ///< shapes at load time (define parameter shapes)
  std::vector<uint8_t> input_types;               ///< dtype of each input, as its integer value
  std::vector<int> consumer_slots;                ///< per consumer: the input slot it feeds
  std::vector<int> index_at_producer;             ///< per input slot: our index in the producer's consumers
  std::vector<uint8_t> producer_is_input;         ///< per input slot: the producer is a data input
  bool is_loss = false;
  bool is_logits = false;
};

/// Training parameters shared by all op actors of a run.
struct actor_run_params {
  uint32_t micro_batches = 1;
  uint64_t seed = 0;
  optim_config optim;
  /// Where the op computes: "cpu", "cuda" or "cuda:N" (ops/backend.hpp make_backend). Data
  /// inputs always stay on the CPU.
  std::string device = "cpu";
  /// How the GEMMs of a CUDA op compute: "fp32" or "bf16" (runtime.precision; ignored on the CPU).
  std::string precision = "fp32";
};

// Serialization for remote spawning (fusion-node): the same names on every node.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_spec& x) {
  return f(caf::meta::type_name("node_spec"), x.id, x.name, x.kind, x.attrs, x.input_shapes, x.input_types,
           x.consumer_slots, x.index_at_producer, x.producer_is_input, x.is_loss, x.is_logits);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_config& x) {
  return f(caf::meta::type_name("optim_config"), x.kind, x.lr, x.min_lr, x.beta1, x.beta2, x.eps, x.weight_decay,
           x.momentum, x.grad_clip, x.warmup_steps, x.total_steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_run_params& x) {
  return f(caf::meta::type_name("actor_run_params"), x.micro_batches, x.seed, x.optim, x.device,
           x.precision);
}

/// Builds the spec of node `id` of a loaded graph.
node_spec make_node_spec(const graph& g, int id);

/// Spawns the actor of one node. Wire it with
/// connect_atom(consumers, producers, coordinator) before sending data. Its backend, op and
/// parameters are created here, on `params.device`, so a device that is missing or a failed
/// allocation throws std::runtime_error to the caller instead of killing the actor silently.
caf::actor spawn_op_actor(caf::actor_system& sys, node_spec spec, actor_run_params params);

}  // namespace fusion
