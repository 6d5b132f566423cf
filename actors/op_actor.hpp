// The operator actor: one per OP-DAG node. It owns the node's parameters, gradients, optimizer
// state and the activations saved per micro-batch, and it is the only place where an op's
// forward and backward run. It does not know whether its neighbours are local or remote.
#pragma once

#include <caf/all.hpp>

#include <map>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "core/graph.hpp"

namespace fusion {

/// Builds the spec of node `id` of a loaded graph.
node_spec make_node_spec(const graph& g, int id);

/// Spawns the actor of one node (its interface: op_actor in actors/messages.hpp). Wire it with
/// connect_atom(consumers, producers, coordinator, ring) before sending data. Its backend, op and
/// parameters are created here, on `params.device`, so a device that is missing or a failed
/// allocation throws std::runtime_error to the caller instead of killing the actor silently.
op_actor spawn_op_actor(caf::actor_system& sys, node_spec spec, actor_run_params params);

}  // namespace fusion
