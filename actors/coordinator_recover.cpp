// Automatic recovery from a lost node (docs/recovery.md). When a node is declared lost while the
// run is wired (connection gone, or no heartbeat within the peer timeout) the coordinator gives up
// the plan in flight: the step in flight is abandoned (st.epoch makes every reply to it stale,
// actors of the given-up plan are `retired` so their late reports are dropped), the run is
// re-planned on the survivors with the policy it started with (scheduler/survivors.hpp), every op
// actor is spawned afresh and wired, and every op gets its state back, in order of preference:
//   1. from a surviving replica (or, when the lost node ran no op, from the survivors): the state
//      of the last completed step, read from the old actors before they are retired; a loss
//      during the optimizer update lets the update finish there (each actor handles the step
//      request before the state request), so that step counts as done;
//   2. from peer-held snapshots (recovery.snapshot-every, actors/coordinator_snapshot.cpp): the
//      newest step whose snapshot every op has on a survivor; every op rewinds to it;
//   3. from the last checkpoint of the run (or the one it resumed from): the run rewinds to its
//      step, and the data source delivers the batches of those steps again (a batch depends only
//      on the seed and the step), as in a run resumed by hand.
// What cannot be recovered fails the run naming the last good checkpoint; nothing is written.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "actors/coordinator_state.hpp"
#include "core/log.hpp"
#include "core/metrics_record.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/survivors.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

/// A plan that a loss made the coordinator give up, with what executed it.
struct given_up_plan {
  plan p;
  std::vector<std::vector<op_actor>> replicas;
  std::map<uint64_t, edge_sender_actor> senders;
};

/// One recovery in flight (a second loss during it restarts it with both nodes lost).
struct recovery_ctx {
  std::vector<size_t> lost;                 // cluster node indices
  std::string why;                          // how the first was lost, in plain words
  clock_type::time_point detected;
  std::string detected_time;                // metrics_time() at detection
  int64_t step_at_loss = 0;                 // steps completed when the loss was detected
  bool step_in_flight = false, in_update = false;
  std::vector<given_up_plan> given_up;      // the plan at detection first
  std::string source;                       // "replicas", "survivors", "snapshots" or "checkpoint"
  std::string checkpoint;                   // the file, when source is "checkpoint"
  std::string held_by;                      // the nodes that held the snapshots (source "snapshots")
  std::map<int, named_tensors> states;      // by op: the survivors' state (not "checkpoint")
  bool states_complete = false;
  int64_t resume_step = 0;                  // the step the survivors' states belong to
  plan next;
  std::string note;                         // what the re-planning changed, for people
};

namespace {

const auto control_timeout = std::chrono::seconds(10);

bool recoverable_phase(const coordinator_state& st) {
  return st.phase == run_phase::ready || st.phase == run_phase::training || st.phase == run_phase::paused;
}

std::string lost_names(const coordinator_state& st, const recovery_ctx& ctx) {
  std::string out;
  for (size_t k = 0; k < ctx.lost.size(); ++k) out += (k ? " and " : "") + node_label(st, ctx.lost[k]);
  return out;
}

std::string op_names(const graph& g, const std::vector<int>& ops) {
  std::string out;
  for (size_t i = 0; i < ops.size() && i < 6; ++i) out += (i ? ", " : "") + g.nodes[ops[i]].name;
  if (ops.size() > 6) out += ", ... (" + std::to_string(ops.size()) + " ops)";
  return out;
}

// The checkpoint a recovery rewinds to: the last one this run wrote, else the one it resumed
// from; "" when there is none.
std::string last_checkpoint_file(const coordinator_state& st) {
  const std::string& last = st.train.last_checkpoint;
  if (auto at = last.rfind(" at step "); at != std::string::npos) return last.substr(0, at);
  return st.in->cfg.resume_from;
}

// Ends the recovery by failing the run: `what` says why it cannot go on. fail() adds the last
// good checkpoint; nothing is saved on the way out.
void give_up(coord_ptr self, const std::shared_ptr<recovery_ctx>& ctx, const std::string& what) {
  auto& st = self->state;
  const std::string msg = lost_names(st, *ctx) + " was lost at step " + std::to_string(ctx->step_at_loss) + " (" +
                          ctx->why + ") and the run cannot go on: " + what + "; nothing was written or overwritten";
  st.recovery.ctx.reset();
  fail(self, make_error(fusion_errc::node_lost, msg));
}

// The survivors of every node: their indices into the cluster file.
std::string survivor_names(const coordinator_state& st) {
  std::string out;
  for (size_t i = 0; i < st.members.nodes.size(); ++i)
    if (usable_node(st, i)) out += (out.empty() ? "" : ", ") + st.in->cluster.nodes[i].name;
  return out;
}

void finish(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  if (st.recovery.ctx != ctx) return;
  st.recovery.ctx.reset();
  st.act = activity::idle;
  ++st.timer;
  ++st.recovery.recoveries;
  for (size_t n : ctx->lost)
    if (!st.members.nodes[n] && st.members.node_state[n] == "lost") st.members.node_state[n] = "recovered";
  const double grace_s = std::max(2.0, 2.0 * static_cast<double>(st.in->cfg.peer_timeout_ms) / 1e3);
  st.recovery.quiet_until = clock_type::now() + ms_of(grace_s);
  // The steps after the restored one will run again: their records go.
  const int64_t at = st.train.step;
  auto& r = st.in->result;
  r.steps.erase(std::remove_if(r.steps.begin(), r.steps.end(), [at](auto& s) { return s.step > at; }), r.steps.end());
  for (auto* v : {&r.val_losses, &r.val_accuracies, &r.val_bits_per_byte})
    v->erase(std::remove_if(v->begin(), v->end(), [at](auto& e) { return e.first > at; }), v->end());
  const int64_t reached = ctx->step_at_loss + (ctx->step_in_flight ? 1 : 0);
  const int64_t lost = std::max<int64_t>(0, reached - at);
  const double seconds = seconds_between(ctx->detected, clock_type::now());
  std::string from = ctx->source == "checkpoint" ? "the checkpoint of step " + std::to_string(at) + " (" + ctx->checkpoint + ")"
                     : ctx->source == "replicas"  ? "the surviving replicas at step " + std::to_string(at)
                     : ctx->source == "snapshots" ? "peer snapshots of step " + std::to_string(at) + " (held by " + ctx->held_by + ")"
                                                  : "the surviving nodes at step " + std::to_string(at);
  char timing[64];
  std::snprintf(timing, sizeof timing, "%.2f s", seconds);
  std::string line = "recovered from the loss of " + lost_names(st, *ctx) + " at step " +
                     std::to_string(ctx->step_at_loss) + ": state from " + from + ", " + std::to_string(lost) +
                     " step(s) lost, ops now on " + survivor_names(st) + ", training again " + timing +
                     " after the loss was detected";
  if (!ctx->note.empty()) line += " (" + ctx->note + ")";
  log_warn("fusion-train", line);
  if (st.train.metrics.is_open()) {
    json nodes = json::array(), sites = json::array();
    for (size_t n : ctx->lost) {
      nodes.push_back(st.in->cluster.nodes[n].name);
      sites.push_back(st.in->cluster.nodes[n].site);
    }
    json rec = {{"type", "recovery"}, {"time", metrics_time()}, {"step", at}, {"nodes", nodes}, {"sites", sites},
                {"reason", ctx->why}, {"detected_at", ctx->detected_time}, {"detected_step", ctx->step_at_loss},
                {"state_from", ctx->source}, {"checkpoint", ctx->checkpoint}, {"held_by", ctx->held_by}, {"steps_lost", lost},
                {"seconds_to_resume", seconds}, {"survivors", survivor_names(st)}, {"note", ctx->note}};
    st.train.metrics << rec.dump() << '\n' << std::flush;
  }
  prepare_snapshots(self);  // for the survivors' plan, while it trains
  // A train request still open goes on from the restored step, also when the loss came after
  // the last step (the final evaluation or checkpoint, which run again at the end).
  if (st.pending.train_rp.pending() && (st.phase == run_phase::training || st.phase == run_phase::ready)) {
    st.train.training_job = true;
    if (st.phase != run_phase::training) enter(self, run_phase::training);
    begin_step(self);
  } else if (st.phase != run_phase::training) {
    run_boundary_tasks(self, [] {});  // admin commands queued during the recovery: no step picks them up
  }
}

// The new actors hold the state of step ctx->resume_step (survivors) or the checkpoint's.
void restore(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  if (ctx->source == "checkpoint") return load_checkpoint_async(self, ctx->checkpoint, [=] { finish(self, ctx); });
  auto who = replica_pairs(st, true);
  const auto timeout = ms_of(st.in->cfg.step_timeout_s);
  gather<bool>(self, who->size(), [=](size_t k) {
    auto [id, r] = (*who)[k];
    return self->request(self->state.exec.replicas[id][r], timeout, set_state_atom::value, ctx->states.at(id));
  }, [=](std::vector<bool>) {
    self->state.train.step = ctx->resume_step;
    finish(self, ctx);
  });
}

// The survivors' plan becomes the run's: fresh op actors, wired, their state restored.
void install(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  st.exec.current = ctx->next;
  st.exec.senders.clear();
  st.exec.pinned_edges.clear();
  st.rebalance.settling.clear();
  try {
    check_replica_routes(st);
    // make_plan gives eager; train.schedule (or auto, for the survivors' stages) decides.
    choose_run_schedule(self);
  } catch (const std::exception& e) {
    return give_up(self, ctx, std::string("the survivors' plan cannot run: ") + e.what());
  }
  spawn_ops(self, [=] {
    create_edges(self, self->state.exec.current.edges, [=] { connect_all(self, [=] { restore(self, ctx); }); });
  });
}

// Ends every op actor and edge of the given-up plans on the surviving nodes and waits for the
// nodes to confirm (errors too: a node may be lost meanwhile, which restarts the recovery).
void retire_given_up(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  auto left = std::make_shared<size_t>(1);  // released after every request went out
  const uint64_t epoch = st.epoch;
  auto settled = [=] {
    if (--*left == 0 && self->state.epoch == epoch) install(self, ctx);
  };
  auto ask = [&](auto handle) {
    ++*left;
    handle.then([=](bool) { settled(); }, [=](caf::error&) { settled(); });
  };
  for (auto& g : ctx->given_up) {
    for (size_t id = 0; id < g.replicas.size(); ++id)
      for (size_t r = 0; r < g.replicas[id].size(); ++r) {
        const auto& a = g.replicas[id][r];
        if (!a) continue;
        const int node = g.p.where.node_of(static_cast<int>(id), static_cast<int>(r));
        if (st.members.nodes[node]) ask(self->request(st.members.nodes[node], control_timeout, retire_atom::value, a));
      }
    for (auto& e : g.p.edges) {
      if (st.members.nodes[e.to]) ask(self->request(st.members.nodes[e.to], control_timeout, unroute_atom::value, e.id));
      if (st.members.nodes[e.from]) ask(self->request(st.members.nodes[e.from], control_timeout, drop_atom::value, e.id));
    }
  }
  settled();
}

// Reads every op's state from a surviving actor of the plan at detection (after the update
// when the loss came during it: the step request is ahead of the state request).
void collect_states(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  const auto& first = ctx->given_up.front();
  auto who = std::make_shared<std::vector<std::pair<int, op_actor>>>();
  for (int id : st.exec.compute_nodes)
    for (int r = 0; r < first.p.where.replicas(id); ++r)
      if (st.members.nodes[first.p.where.node_of(id, r)]) {
        who->emplace_back(id, first.replicas[id][r]);
        break;
      }
  const auto timeout = ms_of(st.in->cfg.step_timeout_s);
  gather<named_tensors>(self, who->size(), [=](size_t k) {
    return self->request((*who)[k].second, timeout, get_state_atom::value);
  }, [=](std::vector<named_tensors> got) {
    for (size_t k = 0; k < got.size(); ++k) ctx->states[(*who)[k].first] = std::move(got[k]);
    ctx->states_complete = true;
    ctx->resume_step = ctx->step_at_loss + (ctx->in_update ? 1 : 0);
    retire_given_up(self, ctx);
  }, [=](caf::error& e) {
    // A survivor that cannot hand its state over: the checkpoint, when there is one, still can.
    auto& s = self->state;
    ctx->checkpoint = last_checkpoint_file(s);
    if (ctx->checkpoint.empty())
      return give_up(self, ctx, "the surviving replicas could not hand over their state (" + describe(e) +
                                    ") and no checkpoint was written");
    ctx->source = "checkpoint";
    retire_given_up(self, ctx);
  });
}

// Reads every op's state from the peer snapshots held on the survivors; without a usable one the
// last checkpoint still can, else the run cannot go on.
void collect_snapshots(coord_ptr self, std::shared_ptr<recovery_ctx> ctx, std::string orphans) {
  auto& st = self->state;
  std::vector<bool> alive(st.members.nodes.size());
  for (size_t i = 0; i < alive.size(); ++i) alive[i] = static_cast<bool>(st.members.nodes[i]);
  restore_from_snapshots(self, alive, [=](snapshot_restore got) {
    ctx->states = std::move(got.states);
    ctx->states_complete = true;
    ctx->resume_step = static_cast<int64_t>(got.step);
    ctx->held_by = got.held_by;
    retire_given_up(self, ctx);
  }, [=](const std::string& why) {
    auto& s = self->state;
    ctx->checkpoint = last_checkpoint_file(s);
    if (ctx->checkpoint.empty())
      return give_up(self, ctx, "ops " + orphans + " ran only there (no surviving replica), the peer snapshots cannot "
                                "replace them (" + why + ") and no checkpoint was written");
    ctx->source = "checkpoint";
    ctx->note += (ctx->note.empty() ? "" : "; ") + std::string("peer snapshots unusable: ") + why;
    retire_given_up(self, ctx);
  });
}

// Decides where the state comes from and plans on the survivors, then goes on.
void plan_recovery(coord_ptr self, std::shared_ptr<recovery_ctx> ctx) {
  auto& st = self->state;
  const auto& cfg = st.in->cfg;
  const auto& first = ctx->given_up.front().p.where;
  std::vector<int> orphaned;  // ops with no replica left
  bool replica_lost = false;
  for (int id : st.exec.compute_nodes) {
    bool kept = false;
    for (int r = 0; r < first.replicas(id); ++r) {
      if (st.members.nodes[first.node_of(id, r)])
        kept = true;
      else
        replica_lost = replica_lost || first.replicas(id) > 1;
    }
    if (!kept) orphaned.push_back(id);
  }
  if (ctx->states_complete) {
    // Read before a second loss: still the state of every op.
  } else if (orphaned.empty()) {
    ctx->source = replica_lost ? "replicas" : "survivors";
  } else if (snapshots_ready(st)) {
    ctx->source = "snapshots";
  } else if (ctx->checkpoint = last_checkpoint_file(st); !ctx->checkpoint.empty()) {
    ctx->source = "checkpoint";
  } else {
    return give_up(self, ctx,
                   "ops " + op_names(st.in->model, orphaned) + " ran only there (no surviving replica) and " +
                       (cfg.checkpoint_file.empty() ? std::string("no checkpoint is kept (output.checkpoint is not set)")
                                                    : "no checkpoint was written yet (output.checkpoint-every " +
                                                          std::to_string(cfg.checkpoint_every) + ")"));
  }
  // The survivors' plan: the same policy as at start, memory checked.
  const auto& c = st.in->cluster;
  std::vector<bool> alive(c.nodes.size());
  // Nodes being admitted are not in the plan yet; a node being drained still is.
  for (size_t i = 0; i < alive.size(); ++i)
    alive[i] = usable_node(st, i) || (st.members.nodes[i] && st.members.node_state[i] == "draining");
  cluster_profile profile = st.exec.profile;
  if (profile.nodes.size() != c.nodes.size()) profile = profile_from_cluster(c);
  profile.micro_batches = static_cast<int>(cfg.micro_batches);
  uint64_t first_id = 1;
  for (auto& g : ctx->given_up) first_id = std::max(first_id, g.p.next_edge_id);
  try {
    // The survivors' schedule is chosen afresh under auto (choose_run_schedule).
    survivor_placement sp = place_on_survivors(st.in->model, c, profile, alive, cfg.compression, fixed_schedule(cfg));
    ctx->note = sp.note;
    ctx->next = make_plan(st.in->model, std::move(sp.where), first_id);
    auto* est = estimator_of(self);
    assign_codecs(ctx->next, est, cfg.compression);
    if (auto short_of = short_of_memory(self, ctx->next.where))
      throw std::runtime_error("the survivors lack memory for the lost ops: node '" + c.nodes[short_of->node].name +
                               "' has " + human_bytes(short_of->have) + ", its ops on the survivors' plan need " +
                               human_bytes(short_of->need));
  } catch (const std::exception& e) {
    return give_up(self, ctx, e.what());
  }
  if (ctx->source == "snapshots" && !ctx->states_complete)
    return collect_snapshots(self, ctx, op_names(st.in->model, orphaned));
  if (ctx->source != "checkpoint" && !ctx->states_complete) return collect_states(self, ctx);
  retire_given_up(self, ctx);
}

}  // namespace

bool recovery_enabled(const coordinator_state& st) {
  const auto& cfg = st.in->cfg;
  if (st.in->cluster.nodes.empty() || cfg.recovery_mode == "off") return false;
  return cfg.recovery_mode == "auto" || !cfg.checkpoint_file.empty();
}

bool recover_from_loss(coord_ptr self, size_t node, const std::string& why) {
  auto& st = self->state;
  if (!recovery_enabled(st) || !recoverable_phase(st)) return false;
  ++st.recovery.losses;
  auto ctx = st.recovery.ctx;
  if (!ctx) {
    ctx = std::make_shared<recovery_ctx>();
    ctx->why = why;
    ctx->detected = clock_type::now();
    ctx->detected_time = metrics_time();
    ctx->step_at_loss = st.train.step;
    ctx->step_in_flight = st.act == activity::step && st.train.cur.has_value();
    ctx->in_update = ctx->step_in_flight && st.train.cur->machine.current() == step_machine::stage::update;
    st.recovery.ctx = ctx;
  }
  ctx->lost.push_back(node);
  // Their reports (a loss, a failure) are of the plan given up from here on; their replies to
  // the state requests below are still read.
  auto retire = [&](const std::vector<std::vector<op_actor>>& replicas) {
    for (auto& op : replicas)
      for (auto& a : op)
        if (a) st.recovery.retired.insert(a.address());
  };
  // A migration that switched plans but is still wiring the new one: the plan it left runs
  // until then and is where the survivors are looked for first (the new plan may hold an op
  // only on the lost node while its old replica still runs elsewhere).
  if (auto before = plan_before_switch(self)) {
    retire(before->second);
    ctx->given_up.push_back({std::move(before->first), std::move(before->second), {}});
  }
  ctx->given_up.push_back({st.exec.current, st.exec.replicas, st.exec.senders});
  retire(st.exec.replicas);
  for (auto& [id, sender] : st.exec.senders)
    if (sender) st.recovery.retired.insert(sender.address());
  // Everything sent under the plan given up is stale from here on.
  ++st.epoch;
  ++st.timer;
  st.train.cur.reset();
  abandon_migration(self, node_label(st, node) + " was lost");
  st.act = activity::recovering;
  refuse_running_task(self, make_error(fusion_errc::busy, node_label(st, node) + " was lost while this command ran; "
                                                                                "the run recovers on the survivors: ask again"));
  // A load waiting for its snapshot holders: its request is answered below.
  st.snap.when_built.clear();
  if (st.pending.pass_rp.pending())
    st.pending.pass_rp.deliver(make_error(fusion_errc::busy, node_label(st, node) + " was lost while this request "
                                                                                         "ran; the run recovers on the "
                                                                                         "survivors: ask again"));
  plan_recovery(self, ctx);
  return true;
}

bool from_retired(coord_ptr self) {
  const auto& retired = self->state.recovery.retired;
  if (retired.empty()) return false;
  const auto& sender = self->current_sender();
  return sender && retired.count(sender->address()) > 0;
}

void on_failure_report(coord_ptr self, caf::error& e) {
  auto& st = self->state;
  if (from_retired(self)) return;
  const auto code = code_of(e);
  const bool channel = code == fusion_errc::connect_failed || code == fusion_errc::wire_rejected;
  if (!channel || !recovery_enabled(st) || !recoverable_phase(st)) return fail(self, e);
  if (st.recovery.ctx || clock_type::now() < st.recovery.quiet_until) {
    log_warn("fusion-train", "ignored after a node loss (it concerns the plan given up): " + describe(e));
    return;
  }
  // Possibly the first sign of a loss the heartbeat has not declared yet: held that long.
  self->delayed_send(self, std::chrono::milliseconds(st.in->cfg.peer_timeout_ms + 1000), fail_atom::value, e,
                     st.recovery.losses);
}

void held_failure_due(coord_ptr self, caf::error& e, uint64_t losses) {
  auto& st = self->state;
  if (st.recovery.losses != losses || st.recovery.ctx) {
    log_warn("fusion-train", "ignored after a node loss (it concerns the plan given up): " + describe(e));
    return;
  }
  fail(self, e);
}

}  // namespace fusion
