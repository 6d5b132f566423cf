#include "actors/scheduler_actor.hpp"

#include <algorithm>

#include "scheduler/survivors.hpp"

namespace fusion {

namespace {

struct scheduler_state {
  rebalancer judge;
  static inline const char* name = "scheduler";
};

scheduler_actor::behavior_type scheduler_fn(scheduler_actor::stateful_pointer<scheduler_state> self) {
  return {
      [=](evaluate_atom, snapshot_ptr& snap) -> verdict_ptr {
        auto out = std::make_shared<schedule_verdict>();
        out->step = snap->step;
        out->first = snap->first;
        auto& judge = self->state.judge;
        // New settings (the admin's `set`) restart the confirmations.
        const auto& s = snap->settings;
        const auto& mine = judge.settings();
        if (s.every != mine.every || s.min_gain != mine.min_gain || s.horizon != mine.horizon ||
            s.confirmations != mine.confirmations || s.first != mine.first)
          judge.configure(s);
        try {
          const auto& u = snap->usable;
          if (std::find(u.begin(), u.end(), false) == u.end()) {
            // A move keeps the running schedule (replan), so proposals are searched under it.
            out->proposal = plan_compressed_run(snap->est, snap->est.profile(), snap->compression,
                                                snap->current.next_edge_id, nullptr, snap->current.schedule);
          } else {
            // The same policy on the nodes that can take work, in the whole cluster's numbering.
            out->proposal = make_plan(snap->est.model(),
                                      place_on_usable(snap->est, u, snap->compression, snap->current.schedule),
                                      snap->current.next_edge_id);
            assign_codecs(out->proposal, &snap->est, snap->compression);
          }
          if (snap->first)
            out->decision = judge.judge_first(snap->est, snap->current, out->proposal, snap->remaining);
          else
            out->decision = snap->count ? judge.evaluate(snap->est, snap->current, out->proposal)
                                        : judge.judge(snap->est, snap->current, out->proposal);
        } catch (const std::exception& e) {
          out->error = e.what();
          judge.reset();
        }
        return out;
      },
      [=](forget_atom) { self->state.judge.reset(); },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys) { return sys.spawn<caf::detached>(scheduler_fn); }

}  // namespace fusion
