// One error convention across actor boundaries: a caf::error of the "fusion" category whose
// code names the kind of failure (fusion_errc) and whose context holds the message in plain
// words, already naming the op, node, file or address. Nothing is classified by its text.
// Pure code throws std::runtime_error; the actor that catches it turns it into one of these.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <string>

namespace fusion {

/// The kinds of failure that cross actor boundaries.
enum class fusion_errc : uint8_t {
  none = 0,
  op_failed,          ///< an op's forward, backward, step or state transfer threw
  bad_state,          ///< checkpoint or migrated state that does not fit the op
  spawn_failed,       ///< an op actor or edge sender could not be created on a node
  connect_failed,     ///< a data channel to a peer could not be opened
  wire_rejected,      ///< a node refused a wire message (bad header, unknown edge, ...)
  refused,            ///< the coordinator refused a node's hello (version, name, device)
  node_lost,          ///< a node process died or stopped answering heartbeats
  timeout,            ///< a step or a request took longer than allowed
  bad_command,        ///< an admin command or argument that does not exist
  wrong_phase,        ///< a request the coordinator cannot serve in its current phase
  interrupted,        ///< the run was stopped (SIGINT, SIGTERM)
  bad_config,         ///< configuration, model or data that cannot run
  busy,               ///< the coordinator is busy with other work (a recovery, ...): ask again
};

/// The category atom of fusion errors.
constexpr caf::atom_value fusion_error_category = caf::atom("fusion");

/// "op_failed", "node_lost", ...
const char* to_string(fusion_errc x);

/// A fusion error with a message in plain words.
caf::error make_error(fusion_errc code, std::string message);

/// Without a message (CAF's conversion from the enum uses this).
caf::error make_error(fusion_errc code);

/// The code of `e` when it is a fusion error, fusion_errc::none otherwise.
fusion_errc code_of(const caf::error& e);

/// What a user reads: the message of a fusion error; CAF's own errors in plain words (a timeout,
/// a lost connection, an unreachable peer), never CAF type or enum names.
std::string describe(const caf::error& e);

/// Registers the category's renderer (so CAF's own logs print plain messages too).
void add_fusion_error_category(caf::actor_system_config& cfg);

}  // namespace fusion
