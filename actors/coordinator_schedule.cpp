// The coordinator's side of live rebalancing (docs/migration.md): at step scheduler.first (once)
// and every scheduler.every steps it hands the scheduler actor (actors/scheduler_actor.hpp) a
// snapshot of the refined estimator and the running plan, logs and records each verdict, and
// queues the migration for the next step boundary when the verdict says migrate. The admin
// commands plan, rebalance, scheduler and set.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "actors/coordinator_state.hpp"
#include "actors/scheduler_actor.hpp"
#include "core/log.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

namespace {

bool opfence_run(const coordinator_state& st) {
  return !st.in->cluster.nodes.empty() && is_opfence(st.in->cluster.placement.policy);
}

scheduler_actor scheduler_of(coord_ptr self) {
  auto& st = self->state;
  if (!st.rebalance.scheduler) {
    st.rebalance.scheduler = spawn_scheduler(self->system());
    self->link_to(st.rebalance.scheduler);
  }
  return st.rebalance.scheduler;
}

std::shared_ptr<schedule_snapshot> snapshot(coord_ptr self, bool count) {
  auto& st = self->state;
  auto* est = estimator_of(self);
  if (!est) return nullptr;
  return std::make_shared<schedule_snapshot>(schedule_snapshot{
      *est, st.exec.current, st.in->cfg.compression, st.rebalance.settings, st.train.step, count, false, 0, usable_nodes(st)});
}

json verdict_json(coord_ptr self, const schedule_verdict& v) {
  auto& st = self->state;
  const auto& d = v.decision;
  json out = {{"step", v.step}};
  if (v.first) out["first"] = true;
  if (!v.error.empty()) {
    out["verdict"] = "none";
    out["reason"] = "re-planning failed: " + v.error;
    return out;
  }
  out["verdict"] = to_string(d.what);
  out["predicted_step_s"] = d.before_s;
  out["proposed_step_s"] = d.after_s;
  out["migration_s"] = d.cost_s;
  out["gain"] = d.gain;
  out["confirmed"] = d.confirmed;
  out["reason"] = d.reason;
  out["diff"] = format_diff(st.in->model, st.in->cluster, diff(st.exec.current, replan(st.in->model, st.exec.current, d.target)));
  return out;
}

// Migrates to the verdict's target now (between steps) and answers `done`.
void apply_verdict(coord_ptr self, verdict_ptr v, std::string why, std::function<void(caf::error, std::string)> done) {
  migrate(self, v->decision.target, std::move(why), [=](caf::error e, std::string summary) {
    self->send(scheduler_of(self), forget_atom::value);
    done(std::move(e), std::move(summary));
  });
}

void on_verdict(coord_ptr self, verdict_ptr v, const plan& judged) {
  auto& st = self->state;
  st.rebalance.in_flight = false;
  auto rec = verdict_json(self, *v);
  rec["type"] = "schedule";
  if (st.train.metrics.is_open()) st.train.metrics << rec.dump() << "\n" << std::flush;
  const bool migrate_now = v->error.empty() && v->decision.what == rebalance_decision::verdict::migrate;
  const std::string line = "scheduler at step " + std::to_string(v->step) + ": " + rec["verdict"].get<std::string>() +
                           ": " + rec["reason"].get<std::string>();
  st.rebalance.last_verdict = line;
  if (migrate_now || v->first || v->decision.what == rebalance_decision::verdict::wait || !v->error.empty())
    log_info("fusion-train", line);
  // After the last step no step gains from it: it would only delay what comes after training.
  if (!migrate_now || st.phase == run_phase::failed || st.train.step >= st.in->cfg.steps) return;
  // The plan may have changed since the snapshot (an admin move): that verdict is stale.
  if (!same_placement(judged.where, st.exec.current.where)) return;
  st.rebalance.at_boundary.push_back({[=](std::function<void()> next) {
                              apply_verdict(self, v, "scheduler: " + v->decision.reason,
                                            [=](caf::error, std::string) { next(); });
                            },
                            [](const caf::error&) {}});
}

}  // namespace

void maybe_reschedule(coord_ptr self) {
  auto& st = self->state;
  const auto& s = st.rebalance.settings;
  const int64_t step = st.train.step;
  // The estimator learns from step 3 on (observe_step).
  if (!s.enabled || !opfence_run(st) || step < 3 || step >= st.in->cfg.steps) return;
  // A node joined (actors/coordinator_join.cpp): judged like the first re-plan, over the
  // remaining steps and without confirmations, as soon as nothing else is in flight.
  const bool offer = st.rebalance.offer;
  const bool first = (s.first > 0 && step == s.first) || offer;
  if (!first && step % s.every != 0) return;
  // Moved ops are judged by what they measure on their new node, once they have settled there.
  std::erase_if(st.rebalance.settling, [&](const auto& kv) { return kv.second < st.train.step; });
  if (st.rebalance.in_flight || st.rebalance.migration || !st.rebalance.settling.empty()) return;
  auto snap = snapshot(self, true);
  if (!snap) return;
  snap->first = first;
  snap->remaining = st.in->cfg.steps - step;
  st.rebalance.in_flight = true;
  st.rebalance.offer = false;
  auto judged = std::make_shared<plan>(st.exec.current);
  self->request(scheduler_of(self), caf::infinite, evaluate_atom::value, snapshot_ptr(snap))
      .then([=](verdict_ptr v) { on_verdict(self, v, *judged); },
            [=](caf::error& e) {
              self->state.rebalance.in_flight = false;
              log_warn("fusion-train", "the scheduler did not answer: " + describe(e));
            });
}

std::optional<caf::result<std::string>> scheduler_command(coord_ptr self, const std::string& verb,
                                                          const std::vector<std::string>& args) {
  auto& st = self->state;
  auto bad = [](const std::string& what) { return caf::result<std::string>(make_error(fusion_errc::bad_command, what)); };
  if (verb == "scheduler") {
    if (args.size() > 1 || (args.size() == 1 && args[0] != "on" && args[0] != "off"))
      return bad("usage: scheduler [on|off]");
    if (args.size() == 1) st.rebalance.settings.enabled = args[0] == "on";
    return caf::result<std::string>(
        json{{"enabled", st.rebalance.settings.enabled}, {"applies", opfence_run(st)}, {"every", st.rebalance.settings.every},
             {"min_gain", st.rebalance.settings.min_gain}, {"horizon", st.rebalance.settings.horizon},
             {"confirmations", st.rebalance.settings.confirmations}, {"first", st.rebalance.settings.first}}
            .dump());
  }
  if (verb == "set") {
    auto eq = args.size() == 1 ? args[0].find('=') : std::string::npos;
    if (eq == std::string::npos || eq == 0) return bad("usage: set KEY=VALUE, e.g. set scheduler.every=5");
    if (auto set = st.rebalance.settings.set(args[0].substr(0, eq), args[0].substr(eq + 1)); !set)
      return bad(set.error());
    return scheduler_command(self, "scheduler", {});
  }
  if (verb != "plan" && verb != "rebalance") return std::nullopt;
  const bool apply = verb == "rebalance" && args.size() == 1 && args[0] == "-y";
  if (!args.empty() && !apply) return bad(verb == "plan" ? "usage: plan" : "usage: rebalance [-y]");
  if (!opfence_run(st))
    return bad("re-planning needs placement policy opfence or opfence-replicas; this run places ops by the cluster file's '" +
               placement_policy_names()[static_cast<int>(st.in->cluster.placement.policy)] + "' policy (use 'move')");
  if (st.phase != run_phase::ready && st.phase != run_phase::training && st.phase != run_phase::paused)
    return caf::result<std::string>(make_error(fusion_errc::wrong_phase, "cannot re-plan while the run is " +
                                                                          std::string(to_string(st.phase))));
  auto snap = snapshot(self, false);
  auto rp = self->make_response_promise();
  auto judged = std::make_shared<plan>(st.exec.current);
  self->request(scheduler_of(self), caf::infinite, evaluate_atom::value, snapshot_ptr(snap))
      .then([=](verdict_ptr v) mutable {
              auto out = verdict_json(self, *v);
              const bool change = v->error.empty() && !same_placement(v->decision.target, judged->where);
              if (!apply || !change) {
                if (!apply && change)
                  out["apply"] = "rebalance -y moves the ops now, whatever the threshold";
                return rp.deliver(out.dump());
              }
              auto work = [=](caf::response_promise p, std::function<void()> next) mutable {
                if (!same_placement(self->state.exec.current.where, judged->where)) {
                  p.deliver(make_error(fusion_errc::bad_command, "the placement changed meanwhile: run 'plan' again"));
                  return next();
                }
                apply_verdict(self, v, "admin: rebalance (" + v->decision.reason + ")", answer_then(p, next));
              };
              run_or_queue(self, rp, work);
            },
            [=](caf::error& e) mutable { rp.deliver(e); });
  return caf::result<std::string>(rp);
}

}  // namespace fusion
