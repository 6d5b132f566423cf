// The coordinator's behavior, one per phase, switched with become() by enter(): a message that
// makes no sense in a phase is not in that phase's behavior, and one default handler answers a
// request of that kind with a wrong_phase error in plain words (and drops a stale notice, such as
// a loss of a step that was abandoned). Every phase also takes the handlers of `every_phase`:
// admin queries and commands, challenges, stop requests, timeouts, failures and shutdown.
//
//   joining   start, hello, "all joined"
//   planning  (profile replies only: request/then)
//   wiring    (spawn, edge, route and connect replies only)
//   ready     train, eval, sample, save, load, rewire; losses and logits of eval and sample passes;
//             hello (a node joins the running job)
//   training  losses, gradient norms, paced feeds, logits (eval every N steps), rewire, resume, hello
//   paused    save, rewire, hello (resume is an admin command: every_phase)
//   finished, failed: every_phase only
#include <caf/all.hpp>

#include <cstdio>
#include <map>

#include "actors/coordinator_state.hpp"
#include "actors/secure_link.hpp"
#include "core/log.hpp"

namespace fusion {

namespace {

// What a request of each kind asks for, in the words of its wrong_phase error.
const std::map<caf::atom_value, const char*>& request_verbs() {
  static const std::map<caf::atom_value, const char*> verbs = {
      {train_atom::value, "train"},          {eval_atom::value, "evaluate"},
      {sample_atom::value, "sample"},        {save_atom::value, "checkpoint"},
      {load_atom::value, "load a checkpoint"}, {rewire_atom::value, "re-wire"},
      {start_atom::value, "start again"},
  };
  return verbs;
}

caf::result<caf::message> out_of_phase(coord_ptr self, caf::message_view& x) {
  auto* element = self->current_mailbox_element();
  // A notice (not a request) of another phase is stale: a loss or feed of an abandoned step, a
  // reply-less report after a failure. Dropped without a word: `delegated` sends nothing back.
  if (element == nullptr || !element->mid.is_request()) return caf::delegated<caf::message>{};
  const auto phase = to_string(self->state.phase);
  auto msg = x.copy_content_to_message();
  if (msg.match_elements<hello_atom, node_hello, node_actor>()) {
    // Who the node is comes first: a node of another cluster should hear that, not "too late".
    const auto& h = msg.get_as<node_hello>(1);
    auto identity = check_node_identity(self->state, h);
    const auto why = identity ? "node '" + h.name + "' comes too late: the run is " + phase : identity.error();
    std::fprintf(stderr, "fusion-train: refused a node: %s\n", why.c_str());
    return make_error(fusion_errc::refused, why);
  }
  std::string what = "this request";
  if (!msg.empty() && msg.match_element<caf::atom_value>(0)) {
    auto it = request_verbs().find(msg.get_as<caf::atom_value>(0));
    what = it != request_verbs().end() ? it->second : "'" + to_string(msg.get_as<caf::atom_value>(0)) + "'";
  }
  return make_error(fusion_errc::wrong_phase, std::string("cannot ") + what + " while " + phase);
}

caf::message_handler every_phase(coord_ptr self) {
  const auto tick = std::chrono::milliseconds(100);
  return {
      [=](challenge_atom, std::string& nonce) -> caf::result<std::string, security::proof> {
        const auto& creds = self->state.in->cfg.credentials;
        if (!creds)
          return make_error(fusion_errc::refused, "this coordinator runs with security.mode=off (plaintext): set "
                                                  "security.mode=off on this node too, or give the coordinator its "
                                                  "certificates");
        auto [mine, proof] = answer_challenge(*creds, self->state.members.challenges, nonce);
        return {std::move(mine), std::move(proof)};
      },
      [=](stop_atom, bool) {  // the stop-flag poll: a signal handler may not send messages
        auto& s = self->state;
        if (s.phase == run_phase::finished) return;
        self->delayed_send(self, tick, stop_atom::value, true);
        if (s.in->cfg.stop_flag && s.in->cfg.stop_flag->load()) self->send(self, stop_atom::value);
      },
      [=](stop_atom) { request_stop(self); },
      [=](stop_atom, uint64_t token) {  // the stop grace expired
        auto& s = self->state;
        (void)token;  // not matched against s.timer: the step arms its own timeouts meanwhile
        if (s.phase != run_phase::training || !s.train.cur) return;
        fail(self, make_error(fusion_errc::interrupted,
                              "interrupted: the step in flight did not finish within " +
                                  format_seconds(s.in->cfg.stop_grace_s) +
                                  " (runtime.stop-grace); no checkpoint written"));
      },
      [=](timeout_atom, uint64_t token) {
        auto& s = self->state;
        if (token != s.timer || s.phase == run_phase::failed) return;
        if (s.act == activity::joining) return join_timed_out(self);
        on_step_timeout(self);
      },
      [=](fail_atom, caf::error& e) { on_failure_report(self, e); },
      [=](admit_atom, int32_t node, uint64_t serial) { profile_joiner(self, static_cast<size_t>(node), serial); },
      [=](fail_atom, caf::error& e, uint64_t losses) { held_failure_due(self, e, losses); },
      [=](query_atom, std::string& topic) -> caf::result<std::string> {
        if (auto refused = local_only(self, "query")) return refused;
        caf::error err;
        auto out = answer_query(self, topic, err);
        if (err) return err;
        return out;
      },
      [=](command_atom, std::string& verb, std::vector<std::string>& args) -> caf::result<std::string> {
        if (auto refused = local_only(self, "command")) return refused;
        return run_command(self, verb, args);
      },
      [=](shutdown_atom) -> caf::result<bool> {
        auto rp = self->make_response_promise();
        shutdown_nodes(self, [=]() mutable {
          rp.deliver(true);
          self->quit();
        });
        return rp;
      },
  };
}

caf::message_handler joining(coord_ptr self) {
  return {
      [=](start_atom) -> caf::result<bool> {
        auto& s = self->state;
        if (s.pending.start_rp.pending()) return make_error(fusion_errc::wrong_phase, "cannot start again while joining");
        s.pending.start_rp = self->make_response_promise();
        begin_join(self);
        return s.pending.start_rp;
      },
      [=](start_atom, bool) { plan_and_wire(self); },  // every node has joined
      [=](hello_atom, node_hello& h, node_actor& node) { return on_hello(self, h, node); },
  };
}

// Why a request between steps (ready, paused) cannot be served now, if it cannot: other work
// runs (a recovery, a migration, another request). Served meanwhile, it met a half-built plan
// (during a recovery: actors of the lost node, or none at all).
std::optional<caf::error> busy_now(const coordinator_state& s, const char* what) {
  if (s.act == activity::idle) return std::nullopt;
  const char* doing = s.act == activity::recovering ? "recovering from the loss of a node"
                      : s.act == activity::migrating ? "moving operators (a migration)"
                      : s.act == activity::eval      ? "evaluating"
                      : s.act == activity::sample    ? "sampling"
                      : s.act == activity::state     ? "saving or loading a checkpoint"
                      : s.act == activity::wiring    ? "wiring the run"
                                                     : "busy with other work";
  return make_error(fusion_errc::busy, std::string("cannot ") + what + " now: the run is " + doing +
                                           "; ask again once that is done");
}

// Work queued at the step boundary while a request ran (an admin checkpoint during an
// evaluation) follows it when no step runs to pick it up.
void after_request(coord_ptr self) {
  if (self->state.phase != run_phase::training) run_boundary_tasks(self, [] {});
}

// A request served at once, answered through a promise once the work behind it is done.
template <class Work>
caf::result<bool> serve(coord_ptr self, Work work) {
  auto& s = self->state;
  s.pending.pass_rp = self->make_response_promise();
  work();
  return s.pending.pass_rp;
}

caf::message_handler rewire_handler(coord_ptr self) {
  return {
      [=](rewire_atom) -> caf::result<bool> {
        auto& s = self->state;
        if (s.phase == run_phase::training) {  // at the next step boundary (begin_step)
          auto rp = self->make_response_promise();
          s.train.rewire_requested = true;
          s.pending.rewire_rps.push_back(rp);
          return rp;
        }
        if (auto busy = busy_now(s, "re-wire")) return *busy;
        // pass_rp: a node lost meanwhile answers it (recover_from_loss).
        return serve(self, [=] {
          apply_rewire(self, [=] {
            self->state.pending.pass_rp.deliver(true);
            after_request(self);
          });
        });
      },
  };
}

// Between steps (ready, paused): a checkpoint of every op's state.
caf::message_handler save_handler(coord_ptr self) {
  return {
      [=](save_atom, std::string& path) -> caf::result<bool> {
        if (auto busy = busy_now(self->state, "save a checkpoint")) return *busy;
        return serve(self, [=] {
          save_checkpoint_async(self, path, [=] {
            self->state.pending.pass_rp.deliver(true);
            after_request(self);
          });
        });
      },
  };
}

// Once the run is wired (ready, training, paused): a node joins the running job.
caf::message_handler late_hello(coord_ptr self) {
  return {
      [=](hello_atom, node_hello& h, node_actor& node) { return on_late_hello(self, h, node); },
  };
}

caf::message_handler pass_results(coord_ptr self) {
  return {
      [=](loss_atom, uint64_t s, uint32_t mb, double l, std::vector<double>& m) {
        if (!from_retired(self)) on_loss(self, s, mb, l, m);
      },
      [=](output_atom, uint64_t, uint32_t, tensor& logits) {
        if (!from_retired(self)) on_output(self, logits);
      },
  };
}

caf::message_handler ready(coord_ptr self) {
  return caf::message_handler{
      [=](train_atom) -> caf::result<bool> {
        auto& s = self->state;
        if (auto busy = busy_now(s, "train")) return *busy;
        s.pending.train_rp = self->make_response_promise();
        begin_training(self);
        return s.pending.train_rp;
      },
      [=](eval_atom) -> caf::result<std::vector<double>> {
        auto& s = self->state;
        if (auto busy = busy_now(s, "evaluate")) return *busy;
        s.pending.pass_rp = self->make_response_promise();
        begin_eval(self, [=](eval_result v) {
          self->state.pending.pass_rp.deliver(std::vector<double>{v.loss, v.accuracy, v.bits_per_byte});
          after_request(self);
        });
        return s.pending.pass_rp;
      },
      [=](sample_atom, int32_t count, std::string& prompt, double temperature, uint64_t seed) -> caf::result<std::string> {
        auto& s = self->state;
        if (!s.in->model.is_text())
          return make_error(fusion_errc::bad_config, "model " + s.in->model.name +
                                                         " is not a text model: there is nothing to sample");
        if (auto busy = busy_now(s, "sample")) return *busy;
        s.pending.pass_rp = self->make_response_promise();
        begin_sample(self, count, std::move(prompt), temperature, seed, [=](std::string text) {
          self->state.pending.pass_rp.deliver(std::move(text));
          after_request(self);
        });
        return s.pending.pass_rp;
      },
      [=](load_atom, std::string& path) -> caf::result<bool> {
        if (auto busy = busy_now(self->state, "load a checkpoint")) return *busy;
        return serve(self, [=] {
          auto rp = self->state.pending.pass_rp;
          load_checkpoint_async(self, path, [=]() mutable {
            // Busy until the new snapshot holders are made: nothing else may start meanwhile.
            self->state.act = activity::state;
            renew_snapshots(self, [=]() mutable {
              auto& s = self->state;
              if (s.act == activity::state) s.act = activity::idle;
              rp.deliver(true);
              after_request(self);
            });
          });
        });
      },
  }
      .or_else(rewire_handler(self))
      .or_else(save_handler(self))
      .or_else(pass_results(self))
      .or_else(late_hello(self));
}

caf::message_handler training(coord_ptr self) {
  return caf::message_handler{
      [=](resume_atom, bool) { begin_step(self); },  // the held step loop goes on
      [=](feed_atom, uint64_t s, uint32_t mb) { on_feed(self, s, mb); },
      [=](grads_atom, uint64_t s, int32_t id, int32_t replica, double v, std::vector<double>& fwd,
          std::vector<double>& bwd, int32_t live, const reduce_timing& ring) {
        if (!from_retired(self)) on_grads(self, s, id, replica, v, fwd, bwd, live, ring);
      },
  }
      .or_else(rewire_handler(self))
      .or_else(pass_results(self))
      .or_else(late_hello(self));
}

}  // namespace

caf::behavior phase_behavior(coord_ptr self, run_phase p) {
  auto common = every_phase(self);
  switch (p) {
    case run_phase::joining: return joining(self).or_else(common);
    case run_phase::ready: return ready(self).or_else(common);
    case run_phase::training: return training(self).or_else(common);
    case run_phase::paused: return rewire_handler(self).or_else(save_handler(self)).or_else(late_hello(self)).or_else(common);
    case run_phase::planning:
    case run_phase::wiring:
    case run_phase::finished:
    case run_phase::failed: break;
  }
  return common;
}

void enter(coord_ptr self, run_phase p) {
  self->state.phase = p;
  self->become(phase_behavior(self, p));
}

void set_out_of_phase_handler(coord_ptr self) {
  self->set_default_handler([self](caf::scheduled_actor*, caf::message_view& x) { return out_of_phase(self, x); });
}

}  // namespace fusion
