// The coordinator of a run: an event-based actor that owns the plan (scheduler/plan.hpp) and
// executes it. It moves through explicit phases
//
//   joining -> planning -> wiring -> ready <-> training <-> paused      (any) -> failed
//                                        \-> finished (shut down)
//
// and reacts to messages only: nodes saying hello, op actors reporting losses, gradient norms
// and failures, replies of nodes and op actors, delayed timeout messages, and requests of the
// session (actors/trainer.hpp), the admin actor and tests. Nothing blocks inside it, so it
// answers queries in every phase. docs/architecture.md draws the phases and protocols.
//
// Requests it serves (the session sends them with request(...).receive):
//   start_atom                            -> true once joined, planned, wired (and resumed)
//   train_atom                            -> true once cfg.steps are done or the run stopped;
//                                            the record is in run_inputs::result
//   eval_atom                             -> {mean validation loss, accuracy} (NaN: no validation
//                                            data; accuracy NaN when the loss op reports none)
//   sample_atom(count, prompt, temp, seed)-> generated text
//   save_atom(path), load_atom(path)      -> true (checkpoints)
//   pause_atom, resume_atom               -> JSON {"phase", "step"}; pause answers once the step
//                                            in flight has finished
//   rewire_atom                           -> true once every cross-node edge was replaced by a
//                                            fresh edge sender at a step boundary
//   query_atom(topic), command_atom(verb, args) -> JSON (actors/admin_protocol.hpp)
//   shutdown_atom                         -> true once nodes were told to exit and local actors
//                                            stopped; the coordinator then quits
// Every failure is a fusion error (actors/errors.hpp) whose message is in plain words.
#pragma once

#include <caf/all.hpp>

#include <memory>

#include "actors/messages.hpp"
#include "actors/run_inputs.hpp"

namespace fusion {

/// Spawns the coordinator of a run (nothing happens before start_atom) and returns the handle its
/// session uses (a typed view: the compiler checks every session request and its answer).
coordinator_session spawn_coordinator(caf::actor_system& sys, std::shared_ptr<run_inputs> inputs);

}  // namespace fusion
