// Live migration of op actors between nodes, at a step boundary (docs/migration.md). For every
// op that moves: a fresh op actor is spawned on the new node; the old actor exports its state
// (parameters, Adam moments, buffers such as batch-norm statistics; gradients are zero between
// steps) through a transfer edge, a plain edge sender from the old node to the new one, chunked
// and flow-controlled like activations and never compressed; the fresh actor restores it. Only
// when every state has arrived does the run switch: the plan diff is applied (edges that became
// local or remote are dropped or created, the others keep their senders), every op learns its
// neighbours, and the old actors end. Until then nothing of the old placement has changed, so a
// failure (a target lost, a state refused) abandons the migration and the run goes on as before.
// A plan with stage replicas changes the same way: every (op, replica) of the new plan whose node
// holds no replica of that op yet is spawned there and gets the state of the op's replica 0
// (replicas are identical between steps); an actor whose node keeps a replica of its op stays and
// takes the replica index, ring and micro-batches the new plan gives it; replicas the new plan
// drops end. So one mechanism adds, drops and moves replicas, changes routes and turns a pipeline
// into a replicated plan and back.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <set>
#include <utility>

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
  std::vector<int> ops;                    // graph node id of every arriving replica
  std::vector<int> replica;                // its replica index in `next`
  std::vector<std::pair<int, int>> moves;  // (node of the op's replica 0 now, its new node)
  std::vector<op_actor> fresh;             // the new op actors, once spawned
  std::vector<plan_edge> transfer;         // one transfer edge per moved op
  bool transfer_edges_made = false;
  uint64_t state_bytes = 0;
  clock_type::time_point t0;
  std::string reason;
  bool over = false;                       // finished or abandoned: late replies are ignored
  std::function<void(caf::error, std::string)> done;
  /// Once commit() switched to `next`: the plan it left and that plan's actors, which run until
  /// the switch is wired (a recovery in that window reads the survivors' state from them).
  bool switched = false;
  plan before;
  std::vector<std::vector<op_actor>> before_replicas;
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

void abandon(coord_ptr self, std::shared_ptr<migration_ctx> m, const std::string& why,
             const std::string& then = "the run goes on with the old placement") {
  if (m->over) return;
  m->over = true;
  auto& st = self->state;
  if (st.rebalance.migration == m) st.rebalance.migration.reset();
  clean_up(self, *m);
  st.act = activity::idle;
  const std::string msg = "migration of " + describe_moves(st, *m) + " abandoned at step " + std::to_string(st.train.step) +
                          ": " + why + "; " + then;
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
  const auto& to = m->next.where;
  const auto& from = st.exec.current.where;
  // Every (op, replica) of the new plan: the arriving actor, or the op's actor already on that node.
  std::vector<std::vector<op_actor>> table(st.exec.replicas.size());
  std::set<caf::actor_addr> kept;
  for (size_t id = 0; id < table.size(); ++id)
    for (int r = 0; r < to.replicas(static_cast<int>(id)); ++r) {
      op_actor a;
      for (size_t i = 0; i < m->ops.size() && !a; ++i)
        if (m->ops[i] == static_cast<int>(id) && m->replica[i] == r) a = m->fresh[i];
      for (int q = 0; q < from.replicas(static_cast<int>(id)) && !a; ++q)
        if (from.node_of(static_cast<int>(id), q) == to.node_of(static_cast<int>(id), r)) a = st.exec.replicas[id][q];
      if (a) kept.insert(a.address());
      table[id].push_back(std::move(a));
    }
  std::vector<std::pair<int, op_actor>> old;  // (node, actor) of every actor the new plan drops
  for (size_t id = 0; id < table.size(); ++id)
    for (int q = 0; q < from.replicas(static_cast<int>(id)); ++q)
      if (const auto& a = st.exec.replicas[id][q]; a && !kept.count(a.address()))
        old.emplace_back(from.node_of(static_cast<int>(id), q), a);
  for (int id : m->ops) st.rebalance.settling[id] = st.train.step + 2;  // as every op's first two steps (observe_step)
  m->switched = true;
  m->before_replicas = std::exchange(st.exec.replicas, std::move(table));
  for (size_t id = 0; id < st.exec.replicas.size(); ++id) st.exec.actors[id] = st.exec.replicas[id].at(0);
  m->before = std::exchange(st.exec.current, m->next);
  plan_diff d = diff(m->before, st.exec.current);
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
          return self->request(s2.members.nodes[old[i].first], control_timeout, retire_atom::value, old[i].second);
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
                         (m->ops.empty() ? summary : describe_moves(s3, *m)).c_str(), line, m->reason.c_str());
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
  try {
    m->next = replan(st.in->model, st.exec.current, std::move(where));
    if (m->next.where.replicated()) check_replica_routes(m->next.where, st.in->cfg.micro_batches, st.in->cluster);
  } catch (const std::exception& e) {
    return m->done(make_error(fusion_errc::bad_command, e.what()), {});
  }
  if (same_placement(st.exec.current.where, m->next.where))
    return m->done({}, json{{"step", st.train.step}, {"diff", "no change"}}.dump());
  for (auto [op, r] : arriving_replicas(st.exec.current.where, m->next.where)) {
    m->ops.push_back(op);
    m->replica.push_back(r);
    m->moves.emplace_back(st.exec.current.where.node_of_op[op], m->next.where.node_of(op, r));
  }
  for (auto& [from, to] : m->moves)
    if (!st.members.nodes[from] || !st.members.nodes[to])
      return m->done(make_error(fusion_errc::bad_state, "node '" + st.in->cluster.nodes[st.members.nodes[from] ? to : from].name +
                                                            "' is gone: nothing can move to or from it"),
                     {});
  st.rebalance.migration = m;
  st.act = activity::migrating;
  // Only routes change, or replicas are dropped: nothing to spawn, no state to carry.
  if (m->ops.empty()) return commit(self, m);
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
  if (auto m = self->state.rebalance.migration; m && !m->over)
    abandon(self, m, why, "the run recovers on the surviving nodes");
}

std::optional<std::pair<plan, std::vector<std::vector<op_actor>>>> plan_before_switch(coord_ptr self) {
  auto m = self->state.rebalance.migration;
  if (!m || m->over || !m->switched) return std::nullopt;
  return std::make_pair(m->before, m->before_replicas);
}

bool abandon_migration_on_loss(coord_ptr self, size_t node) {
  auto& st = self->state;
  auto m = st.rebalance.migration;
  // Switched to the new plan, the migration cannot be undone: a loss needs a recovery.
  if (!m || m->over || m->switched) return false;
  // A node holding only a later replica of a stage holds ops too: the run needs a recovery.
  if (holds_ops(st, node)) return false;
  bool target = std::any_of(m->moves.begin(), m->moves.end(), [&](auto& mv) { return mv.second == static_cast<int>(node); });
  if (!target) return false;
  abandon(self, m, node_label(st, node) + " was lost while its state arrived");
  return true;
}

// ---- moves asked for by the admin shell or the scheduler -----------------------------------------

std::optional<placement> check_placement_change(coord_ptr self, const placement& where, caf::error& err) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  if (same_placement(where, st.exec.current.where)) {
    err = make_error(fusion_errc::bad_command, "that is the running placement: nothing to change");
    return std::nullopt;
  }
  try {
    check_replica_routes(where, st.in->cfg.micro_batches, c);
  } catch (const std::exception& e) {
    err = make_error(fusion_errc::bad_command, e.what());
    return std::nullopt;
  }
  for (size_t id = 0; id < where.node_of_op.size(); ++id)
    for (int r = 0; r < where.replicas(static_cast<int>(id)); ++r) {
      const int node = where.node_of(static_cast<int>(id), r);
      if (!st.members.nodes[node]) {
        err = make_error(fusion_errc::bad_command, "node '" + c.nodes[node].name + "' is " + st.members.node_state[node] +
                                                       ": ops can only move to a joined node");
        return std::nullopt;
      }
    }
  if (auto short_of = short_of_memory(self, where)) {
    err = make_error(fusion_errc::bad_command, "node '" + c.nodes[short_of->node].name + "' has " +
                                                   human_bytes(short_of->have) + " of memory, its ops would need " +
                                                   human_bytes(short_of->need) + " after the move");
    return std::nullopt;
  }
  return where;
}

std::optional<memory_shortage> short_of_memory(coord_ptr self, const placement& where) {
  auto& st = self->state;
  auto* est = estimator_of(self);
  if (!est) return std::nullopt;
  std::vector<double> need(st.in->cluster.nodes.size(), 0.0);
  for (size_t id = 0; id < where.node_of_op.size(); ++id)
    for (int r = 0; r < where.replicas(static_cast<int>(id)); ++r)
      need[where.node_of(static_cast<int>(id), r)] += est->memory_bytes(static_cast<int>(id));
  for (size_t n = 0; n < need.size(); ++n) {
    const auto have = static_cast<double>(st.members.hellos[n].memory_bytes);
    if (have > 0 && need[n] > 0.9 * have) return memory_shortage{n, have, need[n]};
  }
  return std::nullopt;
}

std::optional<placement> check_move(coord_ptr self, const std::vector<int>& ops, int node, caf::error& err) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  if (!usable_node(st, static_cast<size_t>(node))) {
    err = make_error(fusion_errc::bad_command, "node '" + c.nodes[node].name + "' is " + st.members.node_state[node] +
                                                   ": ops can only move to a joined node");
    return std::nullopt;
  }
  const auto& now = st.exec.current.where;
  if (std::all_of(ops.begin(), ops.end(), [&](int id) { return now.node_of_op[id] == node; })) {
    err = make_error(fusion_errc::bad_command, op_list(st.in->model, ops) + " already run(s) on node '" +
                                                   c.nodes[node].name + "'");
    return std::nullopt;
  }
  placement where;
  try {
    where = move_ops(st.in->model, c, now, ops, node, static_cast<int>(st.in->cfg.micro_batches));
  } catch (const std::exception& e) {
    err = make_error(fusion_errc::bad_command, e.what());
    return std::nullopt;
  }
  return check_placement_change(self, where, err);
}

std::optional<placement> check_set_replicas(coord_ptr self, int op, const std::vector<int>& nodes, caf::error& err) {
  auto& st = self->state;
  placement where;
  try {
    where = set_stage_replicas(st.in->model, st.in->cluster, st.exec.current.where, op, nodes,
                               static_cast<int>(st.in->cfg.micro_batches));
  } catch (const std::exception& e) {
    err = make_error(fusion_errc::bad_command, e.what());
    return std::nullopt;
  }
  return check_placement_change(self, where, err);
}

void run_set_replicas(coord_ptr self, int op, std::vector<int> nodes, caf::response_promise rp, std::function<void()> then) {
  auto& st = self->state;
  caf::error err;
  auto where = check_set_replicas(self, op, nodes, err);
  if (!where) {
    rp.deliver(err);
    return then();
  }
  std::string names;
  for (int n : nodes) names += (names.empty() ? "" : ", ") + st.in->cluster.nodes[n].name;
  migrate(self, std::move(*where), "admin: replicas of " + st.in->model.nodes[op].name + "'s stage on " + names,
          answer_then(rp, then));
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
