// The admin protocol: what `fusion-admin HOST:PORT` (and anything else holding the handle)
// may ask of a running coordinator. The coordinator publishes an admin actor of this typed
// interface on admin.port; CAF checks at connect time that both ends speak the same interface
// (remote_actor<admin_actor> fails with a clear error otherwise).
//
// Queries are read-only and answered in every phase (joining ... finished): `status`, `nodes`,
// `placement`, `ops`, `links`. Each returns one JSON object, built in actors/coordinator_admin.cpp;
// docs/admin.md ("--json and the schema of each reply") gives every field. An unknown topic is
// answered with fusion_errc::bad_command.
//
// Commands change the run: a verb and its arguments, answered with a JSON object or an error
// (fusion_errc::bad_command for an unknown verb or a wrong argument, wrong_phase when the run
// cannot do it now; actors/coordinator_commands.cpp): `pause` (the step in flight finishes, the
// next is held), `resume`, `move OP|GLOB NODE`, `replicas OP NODE[,NODE...]`, `drain NODE`, `plan`,
// `rebalance [-y]`, `compress EDGE none|RATIO|auto`, `checkpoint [FILE]`, `scheduler [on|off]`,
// `set KEY=VALUE`. Moves, rebalancing and checkpoints wait for the step boundary while a step
// runs (docs/admin.md).
#pragma once

#include <caf/all.hpp>

#include <string>
#include <vector>

#include "actors/messages.hpp"

namespace fusion {

// query_atom, command_atom and the typed interface admin_actor are declared with the other
// messages (actors/messages.hpp).

/// The query topics, in the order `help` lists them.
inline const std::vector<std::string>& admin_topics() {
  static const std::vector<std::string> topics = {"status", "nodes", "placement", "ops", "links"};
  return topics;
}

/// The command verbs the protocol knows, in the order `help` lists them.
inline const std::vector<std::string>& admin_verbs() {
  static const std::vector<std::string> verbs = {"pause", "resume", "move", "replicas", "drain", "plan", "rebalance", "compress",
                                                 "checkpoint", "scheduler", "set"};
  return verbs;
}

}  // namespace fusion
