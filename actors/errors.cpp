#include "actors/errors.hpp"

namespace fusion {

const char* to_string(fusion_errc x) {
  switch (x) {
    case fusion_errc::none: return "none";
    case fusion_errc::op_failed: return "op_failed";
    case fusion_errc::bad_state: return "bad_state";
    case fusion_errc::spawn_failed: return "spawn_failed";
    case fusion_errc::connect_failed: return "connect_failed";
    case fusion_errc::wire_rejected: return "wire_rejected";
    case fusion_errc::refused: return "refused";
    case fusion_errc::node_lost: return "node_lost";
    case fusion_errc::timeout: return "timeout";
    case fusion_errc::bad_command: return "bad_command";
    case fusion_errc::wrong_phase: return "wrong_phase";
    case fusion_errc::interrupted: return "interrupted";
    case fusion_errc::bad_config: return "bad_config";
    case fusion_errc::busy: return "busy";
  }
  return "unknown";
}

caf::error make_error(fusion_errc code, std::string message) {
  return caf::error{static_cast<uint8_t>(code), fusion_error_category, caf::make_message(std::move(message))};
}

caf::error make_error(fusion_errc code) {
  return caf::error{static_cast<uint8_t>(code), fusion_error_category};
}

fusion_errc code_of(const caf::error& e) {
  if (!e || e.category() != fusion_error_category) return fusion_errc::none;
  return static_cast<fusion_errc>(e.code());
}

namespace {

// The message of a fusion error: the first string of its context.
std::string message_of(const caf::error& e) {
  const auto& ctx = e.context();
  if (ctx.size() >= 1 && ctx.match_element<std::string>(0)) return ctx.get_as<std::string>(0);
  return {};
}

// CAF's own errors, in the words a user of a training run understands. The codes that can reach
// a user are those of requests (timeouts, dead peers) and of connecting to a remote actor.
std::string describe_sec(caf::sec s) {
  switch (s) {
    case caf::sec::request_timeout: return "no answer in time";
    case caf::sec::request_receiver_down: return "the receiving actor is gone";
    case caf::sec::remote_linking_failed:
    case caf::sec::cannot_connect_to_node: return "cannot connect (nothing listens there, or it is unreachable)";
    case caf::sec::disconnect_during_handshake:
      return "the connection closed during the handshake (another program on that port, or a TLS mismatch)";
    case caf::sec::unexpected_actor_messaging_interface:
      return "the other side speaks another protocol (a different build or not a FusionLLM process)";
    case caf::sec::no_actor_published_at_port: return "nothing is published on that port";
    case caf::sec::cannot_open_port: return "cannot listen on that port (in use, or not allowed)";
    case caf::sec::unexpected_message: return "the other side does not understand this message (a different build?)";
    case caf::sec::unexpected_response: return "an unexpected answer";
    case caf::sec::invalid_argument: return "an invalid argument";
    case caf::sec::cannot_spawn_actor_from_arguments: return "cannot start the actor with these arguments";
    case caf::sec::runtime_error: return "an internal error";
    default: return "a communication error";
  }
}

}  // namespace

std::string describe(const caf::error& e) {
  if (!e) return "no error";
  if (e.category() == fusion_error_category) {
    auto msg = message_of(e);
    return msg.empty() ? std::string(to_string(static_cast<fusion_errc>(e.code()))) : msg;
  }
  if (e.category() == caf::atom("system")) {
    // CAF's attached context names its own functions ("ip_connect failed"): left out.
    return describe_sec(static_cast<caf::sec>(e.code()));
  }
  if (e.category() == caf::atom("exit")) {
    switch (static_cast<caf::exit_reason>(e.code())) {
      case caf::exit_reason::remote_link_unreachable: return "the connection to its process was lost";
      case caf::exit_reason::user_shutdown: return "it was shut down";
      case caf::exit_reason::kill: return "it was killed";
      case caf::exit_reason::normal: return "it ended normally";
      default: return "it stopped unexpectedly";
    }
  }
  return "an error of another program (code " + std::to_string(e.code()) + ")";
}

void add_fusion_error_category(caf::actor_system_config& cfg) {
  cfg.add_error_category(fusion_error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) -> std::string {
    std::string out = to_string(static_cast<fusion_errc>(code));
    if (ctx.size() >= 1 && ctx.match_element<std::string>(0)) out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
}

}  // namespace fusion
