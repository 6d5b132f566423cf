// The node actor: one per fusion-node process (one device of one site). After the process has
// said hello to the coordinator, this actor spawns and hosts the op actors placed on the node,
// creates the sending ends of cross-process edges (actors/edge_actor.hpp), receives wire chunks
// for the edges that end here, validates and reassembles them and hands the tensors to the local
// op actors, acknowledging every chunk to its sender. Chunks arrive as wire_atom messages over
// CAF or, by default, over the node's TCP data channel (actors/data_channel.hpp). It reports edge traffic when polled and
// stops everything it hosts when the coordinator ends the run or goes away. Before placement it
// times the run's ops on its device (profile_atom) and probes links to other nodes' data
// channels (probe_atom), each in a detached actor of its own (actors/messages.hpp).
#pragma once

#include <caf/all.hpp>

#include <atomic>
#include <memory>
#include <string>

#include "actors/messages.hpp"

namespace fusion {

namespace net {
class tls_context;
}

class route_table;
class reversal;

/// Who a node is (from its config file).
struct node_identity {
  std::string name;
  std::string site;
  std::string device = "cpu";
  /// The node's certificate and key for its data channel connections (TLS 1.3 to and from
  /// other nodes); null in plaintext runs (security.mode=off).
  std::shared_ptr<const net::tls_context> tls;
  /// Connection reversal, shared with the node's data_channel_server (actors/data_channel.hpp):
  /// whether this node accepts inbound connections, and the links to nodes that do not. Null:
  /// accepts inbound, and cannot send to a node that does not (its tensors go over CAF).
  std::shared_ptr<reversal> reverse;
};

/// Sets CAF's middleman heartbeat and connection timeout, on both ends of every connection, so
/// a peer that dies or hangs (SIGSTOP) is declared down after `timeout_ms`. Throws
/// std::runtime_error unless 0 < heartbeat_ms < timeout_ms.
void set_liveness(caf::actor_system_config& cfg, int64_t heartbeat_ms, int64_t timeout_ms);

/// Selects CAF's scheduler: "stealing" (work stealing; idle workers poll before they sleep) or
/// "sharing" (one shared queue; idle workers sleep at once, which leaves the cores to the compute
/// of other processes on the same host). Throws std::runtime_error for anything else.
void set_scheduler_policy(caf::actor_system_config& cfg, const std::string& policy);

/// Spawns the node actor. `exit_code` is set to 0 when the coordinator ends the run with
/// shutdown_atom and to 1 when the coordinator disappears first. `routes` is shared with the
/// node's data_channel_server (actors/data_channel.hpp), which delivers by the same routes.
node_actor spawn_node_actor(caf::actor_system& sys, node_identity id, std::shared_ptr<std::atomic<int>> exit_code,
                            std::shared_ptr<route_table> routes);

}  // namespace fusion
