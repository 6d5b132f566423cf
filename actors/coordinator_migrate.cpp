// Live migration of op actors between nodes, at a step boundary (docs/migration.md). For every
// op that moves: a fresh op actor is spawned on the new node; the old actor exports its state
// (parameters, Adam moments, buffers such as batch-norm statistics; gradients are zero between
// steps) through a transfer edge, a plain edge sender from the old node to the new one, chunked
// and flow-controlled like activations and never compressed; the fresh actor restores it. Only
// when every state has arrived does the run switch: the plan diff is applied (edges that became
// local or remote are dropped or created, the others keep their senders), every op learns its
// neighbours, and the old actors end. Until then nothing of the old placement has changed, so a
// failure (a target lost, a state refused) abandons the migration and the run goes on as before.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "actors/coordinator_state.hpp"
#include "actors/edge_actor.hpp"
#include "actors/op_actor.hpp"
#include "actors/op_device.hpp"
#include "core/log.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

/// One migration in flight.
struct migration_ctx {
  plan next;
  std::vector<int> ops;                    // moved graph node ids
  std::vector<std::pair<int, int>> moves;  // (old, new) cluster node of each
  std::vector<op_actor> fresh;             // the new op actors, once spawned
  std::vector<plan_edge> transfer;         // one transfer edge per moved op
  bool transfer_edges_made = false;
  uint64_t state_bytes = 0;
  clock_type::time_point t0;
  std::string reason;
  bool over = false;                       // finished or abandoned: late replies are ignored
  std::function<void(caf::error, std::string)> done;
};

namespace {

const auto control_timeout = std::chrono::seconds(60);

// "a, b, c", the first six items and a count of the others: what messages and metrics name.
std::string short_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < 6; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > 6) out += ", ... (" + std::to_string(items.size()) + " ops)";
  return out;
}

std::string op_list(const graph& g, const std::vector<int>& ops) {
  std::vector<std::string> names;
  for (int id : ops) names.push_back(g.nodes[id].name);
  return short_list(names);
}

std::string describe_moves(const coordinator_state& st, const migration_ctx& m) {
  std::vector<std::string> moves;
  for (size_t i = 0; i < m.ops.size(); ++i)
    moves.push_back(st.in->model.nodes[m.ops[i]].name + ": " + st.in->cluster.nodes[m.moves[i].first].name + " -> " +
                    st.in->cluster.nodes[m.moves[i].second].name);
  return short_list(moves);
}

// Ends what an abandoned migration made: the fresh actors and the transfer edges. Nodes that are
// gone are skipped; replies (or their absence) do not matter any more.
void clean_up(coord_ptr self, const migration_ctx& m) {
  auto& st = self->state;
  for (size_t i = 0; i < m.fresh.size(); ++i)
    if (m.fresh[i] && st.members.nodes[m.moves[i].second])
      self->request(st.members.nodes[m.moves[i].second], control_timeout, retire_atom::value, m.fresh[i])
          .then([](bool) {}, [=](caf::error&) {});
  if (!m.transfer_edges_made) return;
  for (auto& e : m.transfer) {
    if (st.members.nodes[e.to])
      self->request(st.members.nodes[e.to], control_timeout, unroute_atom::value, e.id).then([](bool) {}, [=](caf::error&) {});
    if (st.members.nodes[e.from])
      self->request(st.members.nodes[e.from], control_timeout, drop_atom::value, e.id).then([](bool) {}, [=](caf::error&) {});
    st.exec.senders.erase(e.id);
  }
}

void abandon(coord_ptr self, std::shared_ptr<migration_ctx> m, const std::string& why) {
  if (m->over) return;
  m->over = true;
  auto& st = self->state;
  if (st.rebalance.migration == m) st.rebalance.migration.reset();
  clean_up(self, *m);
  st.act = activity::idle;
  const std::string msg = "migration of " + describe_moves(st, *m) + " abandoned at step " + std::to_string(st.train.step) +
                          ": " + why + "; the run goes on with the old placement";
  log_warn("fusion-train", msg);
  if (st.train.metrics.is_open())
    st.train.metrics << json{{"type", "migration"}, {"step", st.train.step}, {"ok", false}, {"ops", op_list(st.in->model, m->ops)},
                       {"reason", m->reason}, {"error", why}}
                      .dump()
               << "\n"
               << std::flush;
  m->done(make_error(fusion_errc::bad_state, msg), {});
}

// The switch: from here on the new actors are the run's; a failure fails the run.
void commit(coord_ptr self, std::shared_ptr<migration_ctx> m) {
  auto& st = self->state;
  std::vector<op_actor> old;
  for (size_t i = 0; i < m->ops.size(); ++i) {
    old.push_back(st.exec.actors[m->ops[i]]);
    st.exec.actors[m->ops[i]] = m->fresh[i];
    st.exec.replicas[m->ops[i]] = {m->fresh[i]};  // migration runs on pipeline plans only (migrate)
    st.rebalance.settling[m->ops[i]] = st.train.step + 2;  // as every op's first two steps (observe_step)
  }
  plan before = std::move(st.exec.current);
  st.exec.current = m->next;
  plan_diff d = diff(before, st.exec.current);
  // New edges get the codec their link runs at (AdaTopK re-evaluates them with the others).
  const auto& c = st.in->cfg.compression;
  for (auto& a : d.added) {
    edge_codec_state link;  // governors exist only under an adaptive codec
    if (auto g = st.exec.governors.find(std::make_tuple(a.from, a.to, a.forward())); g != st.exec.governors.end())
      link.link_ratio = g->second.current();
    a.setting = codec_for_edge(a, c, link);
    for (auto& e : st.exec.current.edges)
      if (e.id == a.id) e.setting = a.setting;
  }
  std::vector<plan_edge> add = d.added, drop = d.removed;
  for (auto& [b, a] : d.changed) add.push_back(a), drop.push_back(b);
  for (auto& e : m->transfer) drop.push_back(e);
  const std::string summary = format_diff(st.in->model, st.in->cluster, d);
  create_edges(self, add, [=] {
    connect_all(self, [=] {
      drop_edges(self, drop, [=] {
        gather<bool>(self, old.size(), [=](size_t i) {
          auto& s2 = self->state;
          return self->request(s2.members.nodes[m->moves[i].first], control_timeout, retire_atom::value, old[i]);
        }, [=](std::vector<bool>) {
          auto& s3 = self->state;
          m->over = true;
          if (s3.rebalance.migration == m) s3.rebalance.migration.reset();
          s3.act = activity::idle;
          const double seconds = seconds_between(m->t0, clock_type::now());
          char line[160];
          std::snprintf(line, sizeof line, " (%s of state in %.2f s)", human_bytes(static_cast<double>(m->state_bytes)).c_str(),
                        seconds);
          if (s3.in->cfg.progress)
            std::fprintf(stderr, "fusion-train: migrated at step %lld: %s%s; %s\n", static_cast<long long>(s3.train.step),
                         describe_moves(s3, *m).c_str(), line, m->reason.c_str());
          json rec = {{"type", "migration"}, {"step", s3.train.step}, {"ok", true}, {"ops", op_list(s3.in->model, m->ops)},
                      {"moves", describe_moves(s3, *m)}, {"state_bytes", m->state_bytes}, {"seconds", seconds},
                      {"diff", summary}, {"reason", m->reason}};
          if (s3.train.metrics.is_open()) s3.train.metrics << rec.dump() << "\n" << std::flush;
          m->done({}, rec.dump());
        });
      });
    });
  });
}

// Every state is on its way: wait for the fresh actors to restore them.
void import_states(coord_ptr self, std::shared_ptr<migration_ctx> m, std::vector<state_export> sent) {
  for (auto& s : sent) m->state_bytes += s.bytes;
  // The slowest link decides; a generous floor keeps a healthy but busy link from timing out.
  double seconds = 60;
  auto* est = estimator_of(self);
  for (size_t i = 0; i < m->ops.size() && est; ++i)
    seconds = std::max(seconds, 4 * est->transfer_s(static_cast<double>(sent[i].bytes), m->moves[i].first,
                                                   m->moves[i].second));
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
  gather<bool>(self, m->ops.size(), [=](size_t i) {
    return self->request(m->fresh[i], timeout, import_atom::value, sent[i].tensors);
  }, [=](std::vector<bool>) {
    if (!m->over) commit(self, m);
  }, [=](caf::error& e) { abandon(self, m, describe(e)); });
}

void export_states(coord_ptr self, std::shared_ptr<migration_ctx> m) {
  m->transfer.clear();
  for (size_t i = 0; i < m->ops.size(); ++i) {
    plan_edge e;
    e.id = m->next.next_edge_id++;
    e.producer = e.consumer = m->ops[i];
    e.from = m->moves[i].first;
    e.to = m->moves[i].second;
    m->transfer.push_back(e);
  }
  auto fresh_of = [m](const plan_edge& e) -> tensor_sink {
    for (size_t i = 0; i < m->transfer.size(); ++i)
      if (m->transfer[i].id == e.id) return m->fresh[i];
    return {};
  };
  auto on_error = [=](caf::error& e) { abandon(self, m, describe(e)); };
  create_edges(self, m->transfer, [=] {
    if (m->over) return;
    m->transfer_edges_made = true;
    const uint64_t step = static_cast<uint64_t>(self->state.train.step);
    gather<state_export>(self, m->ops.size(), [=](size_t i) {
      auto& s = self->state;
      tensor_sink sender = s.exec.senders.at(m->transfer[i].id);
      return self->request(s.exec.actors[m->ops[i]], control_timeout, export_atom::value, sender, step);
    }, [=](std::vector<state_export> sent) {
      if (!m->over) import_states(self, m, std::move(sent));
    }, on_error);
  }, on_error, fresh_of);
}

}  // namespace

void migrate(coord_ptr self, placement where, std::string reason, std::function<void(caf::error, std::string)> done) {
  auto& st = self->state;
  auto m = std::make_shared<migration_ctx>();
  m->reason = std::move(reason);
  m->done = std::move(done);
  m->t0 = clock_type::now();
  // The scheduler re-plans pipeline-only (policy opfence); live migration moves ops of one
  // replica with their state, and has no way yet to add, drop or move a replica, nor to move
  // the ops of a run that has replicas.
  if (where.replicated() || st.exec.current.where.replicated()) {
    const placement& shown = where.replicated() ? where : st.exec.current.where;
    return m->done(make_error(fusion_errc::bad_command,
                              std::string(where.replicated() ? "the new placement" : "this run") +
                                  " has stage replicas (" +
                                  format_replicated_stages(st.in->model, st.in->cluster, shown) +
                                  "), which live migration does not move yet: nothing moved"),
                   {});
  }
  try {
    m->next = replan(st.in->model, st.exec.current, std::move(where));
  } catch (const std::exception& e) {
    return m->done(make_error(fusion_errc::bad_command, e.what()), {});
  }
  plan_diff d = diff(st.exec.current, m->next);
  if (d.moved_ops.empty()) return m->done({}, json{{"step", st.train.step}, {"diff", "no change"}}.dump());
  m->ops = d.moved_ops;
  m->moves = d.moves;
  for (auto& [from, to] : m->moves)
    if (!st.members.nodes[from] || !st.members.nodes[to])
      return m->done(make_error(fusion_errc::bad_state, "node '" + st.in->cluster.nodes[st.members.nodes[from] ? to : from].name +
                                                            "' is gone: nothing can move to or from it"),
                     {});
  st.rebalance.migration = m;
  st.act = activity::migrating;
  const auto cpu_ops = split_patterns(st.in->cfg.cpu_ops);
  actor_run_params run{static_cast<uint32_t>(st.in->cfg.micro_batches), st.in->cfg.seed, st.in->cfg.optim};
  run.precision = st.in->cfg.precision;
  gather<op_actor>(self, m->ops.size(), [=](size_t i) mutable {
    auto& s = self->state;
    const int node = m->moves[i].second;
    run.device = device_for_op(s.in->cluster.nodes[node].device, cpu_ops, s.in->model.nodes[m->ops[i]].name);
    return self->request(s.members.nodes[node], control_timeout, spawn_atom::value, make_node_spec(s.in->model, m->ops[i]), run);
  }, [=](std::vector<op_actor> made) {
    m->fresh = std::move(made);
    if (!m->over) export_states(self, m);
  }, [=](caf::error& e) { abandon(self, m, describe(e)); });
}

void end_migration(coord_ptr self, const caf::error& why) {
  auto m = self->state.rebalance.migration;
  if (!m || m->over) return;
  m->over = true;
  self->state.rebalance.migration.reset();
  m->done(why, {});
}

void abandon_migration(coord_ptr self, const std::string& why) {
  if (auto m = self->state.rebalance.migration; m && !m->over) abandon(self, m, why);
}

bool abandon_migration_on_loss(coord_ptr self, size_t node) {
  auto& st = self->state;
  auto m = st.rebalance.migration;
  if (!m || m->over) return false;
  const auto& where = st.exec.current.where.node_of_op;
  if (std::find(where.begin(), where.end(), static_cast<int>(node)) != where.end()) return false;
  bool target = std::any_of(m->moves.begin(), m->moves.end(), [&](auto& mv) { return mv.second == static_cast<int>(node); });
  if (!target) return false;
  abandon(self, m, node_label(st, node) + " was lost while its state arrived");
  return true;
}

// ---- moves asked for by the admin shell or the scheduler -----------------------------------------

std::optional<placement> check_move(coord_ptr self, const std::vector<int>& ops, int node, caf::error& err) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  if (!usable_node(st, static_cast<size_t>(node))) {
    err = make_error(fusion_errc::bad_command, "node '" + c.nodes[node].name + "' is " + st.members.node_state[node] +
                                                   ": ops can only move to a joined node");
    return std::nullopt;
  }
  placement where = st.exec.current.where;
  for (int id : ops) where.node_of_op[id] = node;
  if (where.node_of_op == st.exec.current.where.node_of_op) {
    err = make_error(fusion_errc::bad_command, op_list(st.in->model, ops) + " already run(s) on node '" +
                                                   c.nodes[node].name + "'");
    return std::nullopt;
  }
  // The memory the ops would take there (parameters, gradients, moments, saved activations).
  if (auto* est = estimator_of(self); est && st.members.hellos[node].memory_bytes > 0) {
    double need = 0;
    for (size_t id = 0; id < where.node_of_op.size(); ++id)
      if (where.node_of_op[id] == node) need += est->memory_bytes(static_cast<int>(id));
    if (need > 0.9 * static_cast<double>(st.members.hellos[node].memory_bytes)) {
      err = make_error(fusion_errc::bad_command,
                       "node '" + c.nodes[node].name + "' has " +
                           human_bytes(static_cast<double>(st.members.hellos[node].memory_bytes)) + " of memory, its ops would need " +
                           human_bytes(need) + " after the move");
      return std::nullopt;
    }
  }
  return where;
}

void run_move(coord_ptr self, std::vector<int> ops, int node, caf::response_promise rp, std::function<void()> then) {
  auto& st = self->state;
  caf::error err;
  auto where = check_move(self, ops, node, err);
  if (!where) {
    rp.deliver(err);
    return then();
  }
  migrate(self, std::move(*where), "admin: move to node '" + st.in->cluster.nodes[node].name + "'",
          answer_then(rp, then));
}

}  // namespace fusion
