// The coordinator's work outside training: nodes join, the run is planned from their profile, op
// actors are spawned and wired by executing the plan, and later re-wired by applying a plan diff
// at a step boundary; stop requests, failure and shutdown. Which messages each phase takes is in
// actors/coordinator_phases.cpp, measuring the profile between joining and placing in
// actors/coordinator_profile.cpp, training steps in actors/coordinator_train.cpp.
#include <caf/io/all.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "actors/coordinator.hpp"
#include "actors/admin_protocol.hpp"
#include "actors/coordinator_state.hpp"
#include "actors/edge_actor.hpp"
#include "actors/op_actor.hpp"
#include "actors/op_device.hpp"
#include "actors/secure_link.hpp"
#include "core/log.hpp"
#include "core/wire.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

const char* to_string(run_phase p) {
  switch (p) {
    case run_phase::joining: return "joining";
    case run_phase::planning: return "planning";
    case run_phase::wiring: return "wiring";
    case run_phase::ready: return "ready";
    case run_phase::training: return "training";
    case run_phase::paused: return "paused";
    case run_phase::finished: return "finished";
    case run_phase::failed: return "failed";
  }
  return "?";
}

std::string node_label(const coordinator_state& st, size_t i) {
  const auto& n = st.in->cluster.nodes[i];
  return "node '" + n.name + "' (site " + n.site + ")";
}

namespace {

bool cluster_mode(const coordinator_state& st) { return !st.in->cluster.nodes.empty(); }

// ---- planning and wiring ----------------------------------------------------------------------

void finish_start(coord_ptr self) {
  auto& st = self->state;
  enter(self, run_phase::ready);
  st.act = activity::idle;
  ++st.timer;
  if (st.pending.start_rp.pending()) st.pending.start_rp.deliver(true);
}

// The handle replica `ra` of op `n` sends its output for consumer number `i` to when the
// micro-batch goes on through the consumer's replica `rb`, and the one replica `rn` of `n` sends
// the gradient of input `slot` to when the producer's replica is `rp`: the op actor itself when
// both ends share a node, else the edge sender of that direction.
tensor_sink consumer_handle(coordinator_state& st, const graph_node& n, int i, int ra, int rb) {
  if (auto* e = st.exec.current.find(n.id, i, true, ra, rb)) return st.exec.senders.at(e->id);
  return st.exec.replicas[n.consumers[i].node][rb];
}

tensor_sink producer_handle(coordinator_state& st, const graph& g, const graph_node& n, int slot, int rn, int rp) {
  int p = n.inputs[slot];
  const auto& cons = g.nodes[p].consumers;
  for (int i = 0; i < static_cast<int>(cons.size()); ++i)
    if (cons[i].node == n.id && cons[i].slot == slot) {
      if (auto* e = st.exec.current.find(p, i, false, rp, rn)) return st.exec.senders.at(e->id);
      break;
    }
  return st.exec.replicas[p][rp];
}

// What replica `r` of op `id` is told by connect_atom: per (consumer or input slot, micro-batch)
// the sink of the micro-batch's route (null for micro-batches routed through another replica:
// they never reach it), its micro-batches, and its gradient ring's next hop.
struct wiring {
  std::vector<tensor_sink> consumers, producers;
  replica_ring ring;
};

wiring wiring_of(coordinator_state& st, int id, int r) {
  const graph& g = st.in->model;
  const auto& n = g.nodes[id];
  const auto& w = st.exec.current.where;
  const int M = static_cast<int>(st.in->cfg.micro_batches);
  wiring out;
  out.ring.replica = static_cast<uint32_t>(r);
  out.ring.replicas = static_cast<uint32_t>(w.replicas(id));
  out.ring.live_limit = static_cast<uint32_t>(live_limits(g, w, st.exec.current.schedule).at(id));
  out.ring.forwards_first = st.exec.current.schedule == pipeline_schedule::gpipe && !n.is_input();
  for (int m = 0; m < M; ++m)
    if (w.replica_of(id, m) == r) out.ring.local_mbs.push_back(static_cast<uint32_t>(m));
  for (int i = 0; i < static_cast<int>(n.consumers.size()); ++i)
    for (int m = 0; m < M; ++m)
      out.consumers.push_back(w.replica_of(id, m) == r ? consumer_handle(st, n, i, r, w.replica_of(n.consumers[i].node, m))
                                                       : tensor_sink{});
  for (int slot = 0; slot < static_cast<int>(n.inputs.size()); ++slot)
    for (int m = 0; m < M; ++m)
      out.producers.push_back(w.replica_of(id, m) == r
                                  ? producer_handle(st, g, n, slot, r, w.replica_of(n.inputs[slot], m))
                                  : tensor_sink{});
  if (out.ring.replicas > 1) {
    if (auto* e = st.exec.current.find_reduce(id, r))
      out.ring.next = st.exec.senders.at(e->id);
    else
      out.ring.next = st.exec.replicas[id][(r + 1) % w.replicas(id)];
    // Every replica rounds alike, so they agree on the sum whichever hops the codec carries.
    out.ring.f16_values = st.in->cfg.compression.allreduce == value_type::f16;
  }
  return out;
}

}  // namespace

void connect_all(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  auto me = caf::actor_cast<op_reporter>(self);
  const auto timeout = ms_of(st.in->cfg.step_timeout_s);
  auto all = replica_pairs(st, false);
  gather<bool>(self, all->size(), [=](size_t k) {
    auto& s = self->state;
    auto [id, r] = (*all)[k];
    wiring wired = wiring_of(s, id, r);
    return self->request(s.exec.replicas[id][r], timeout, connect_atom::value, std::move(wired.consumers),
                         std::move(wired.producers), me, std::move(wired.ring));
  }, [=](std::vector<bool>) { done(); });
}

std::shared_ptr<std::vector<std::pair<int, int>>> replica_pairs(const coordinator_state& st, bool compute_only) {
  auto out = std::make_shared<std::vector<std::pair<int, int>>>();
  for (auto& n : st.in->model.nodes)
    if (!compute_only || !n.is_input())
      for (int r = 0; r < st.exec.current.where.replicas(n.id); ++r) out->emplace_back(n.id, r);
  return out;
}

static tensor_sink edge_target(const coordinator_state& st, const plan_edge& e) {
  switch (e.kind) {
    case edge_kind::forward: return st.exec.replicas[e.consumer][e.consumer_replica];
    case edge_kind::backward: return st.exec.replicas[e.producer][e.producer_replica];
    case edge_kind::reduce: break;
  }
  return st.exec.replicas[e.producer][e.consumer_replica];  // the receiving replica of the ring hop
}

void create_edges(coord_ptr self, std::vector<plan_edge> add, std::function<void()> done,
                  std::function<void(caf::error&)> on_error, std::function<tensor_sink(const plan_edge&)> target_of) {
  auto& st = self->state;
  const auto& cfg = st.in->cfg;
  const edge_config ec = cfg.flow.clamped();
  const bool tcp = cfg.transport == "tcp";
  const auto timeout = std::chrono::seconds(60);
  auto edges = std::make_shared<std::vector<plan_edge>>(std::move(add));
  gather<edge_sender_actor>(self, edges->size(), [=](size_t i) {
    auto& s = self->state;
    const auto& e = (*edges)[i];
    const auto& peer = s.members.hellos[e.to];
    // A receiver behind a firewall (the cluster file says so, or it listens nowhere) dials the
    // sender's data channel itself (connection reversal, docs/transport.md).
    const bool dials = tcp && (!s.in->cluster.nodes[e.to].accept_inbound || peer.data_port == 0);
    return self->request(s.members.nodes[e.from], timeout, edge_atom::value, e.id, node_inbox{s.members.nodes[e.to]}, ec,
                         tcp ? peer.host : std::string{}, tcp ? peer.data_port : uint16_t{0}, dials, peer.name,
                         e.setting);
  }, [=](std::vector<edge_sender_actor> made) {
    auto& s = self->state;
    for (size_t i = 0; i < made.size(); ++i) s.exec.senders[(*edges)[i].id] = made[i];
    gather<bool>(self, edges->size(), [=](size_t i) {
      auto& s2 = self->state;
      const auto& e = (*edges)[i];
      tensor_sink target = target_of ? target_of(e) : edge_target(s2, e);
      return self->request(s2.members.nodes[e.to], timeout, route_atom::value, e.id, target, s2.exec.senders.at(e.id));
    }, [=](std::vector<bool>) { done(); }, on_error);
  }, on_error);
}

void drop_edges(coord_ptr self, std::vector<plan_edge> drop, std::function<void()> done) {
  auto edges = std::make_shared<std::vector<plan_edge>>(std::move(drop));
  const auto timeout = std::chrono::seconds(60);
  gather<bool>(self, edges->size() * 2, [=](size_t k) {
    auto& s = self->state;
    const auto& e = (*edges)[k / 2];
    if (k % 2 == 0) return self->request(s.members.nodes[e.to], timeout, unroute_atom::value, e.id);
    return self->request(s.members.nodes[e.from], timeout, drop_atom::value, e.id);
  }, [=](std::vector<bool>) {
    for (auto& e : *edges) self->state.exec.senders.erase(e.id);
    done();
  });
}

void spawn_ops(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  const graph& g = st.in->model;
  actor_run_params run{static_cast<uint32_t>(st.in->cfg.micro_batches), st.in->cfg.seed, st.in->cfg.optim};
  run.precision = st.in->cfg.precision;
  const auto cpu_ops = split_patterns(st.in->cfg.cpu_ops);
  st.exec.actors.assign(g.nodes.size(), op_actor{});
  st.exec.replicas.assign(g.nodes.size(), {});
  if (!cluster_mode(st)) {
    try {
      for (auto& n : g.nodes) {
        run.device = device_for_op(normalize_device(st.in->cfg.device), cpu_ops, n.name);
        st.exec.actors[n.id] = spawn_op_actor(self->system(), make_node_spec(g, n.id), run);
        st.exec.replicas[n.id] = {st.exec.actors[n.id]};
        // Linked: if the coordinator dies of an error, its local op actors end with it (remote
        // ones end with their node, which watches the coordinator).
        self->link_to(st.exec.actors[n.id]);
      }
    } catch (const std::exception& e) {
      return fail(self, make_error(fusion_errc::spawn_failed, e.what()));
    }
    return done();
  }
  // One op actor per (op, replica), each with the op's initial weights: they depend only on the
  // seed and the op's name (core/param_init.hpp), so every replica starts identical.
  auto all = replica_pairs(st, false);
  gather<op_actor>(self, all->size(), [=](size_t k) mutable {
    auto& s = self->state;
    auto [id, r] = (*all)[k];
    int node = s.exec.current.where.node_of(id, r);
    run.device = device_for_op(s.in->cluster.nodes[node].device, cpu_ops, s.in->model.nodes[id].name);
    return self->request(s.members.nodes[node], std::chrono::seconds(60), spawn_atom::value, make_node_spec(s.in->model, id),
                         run);
  }, [=](std::vector<op_actor> made) {
    auto& s = self->state;
    for (size_t k = 0; k < made.size(); ++k) s.exec.replicas[(*all)[k].first].push_back(std::move(made[k]));
    for (size_t id = 0; id < s.exec.replicas.size(); ++id) s.exec.actors[id] = s.exec.replicas[id].at(0);
    done();
  });
}

// Every replica of a stage must run a micro-batch of every step (it takes part in the gradient
// all-reduce, and its timing and updates are waited for): refuse a plan where some replica gets
// none before any op is spawned.
void check_replica_routes(const coordinator_state& st) {
  check_replica_routes(st.exec.current.where, st.in->cfg.micro_batches, st.in->cluster);
}

void check_replica_routes(const placement& where, int64_t M, const cluster_spec& c) {
  if (!where.replicated()) return;
  if (static_cast<int64_t>(where.routes.size()) != M)
    throw std::runtime_error("the plan deals routes for " + std::to_string(where.routes.size()) +
                             " micro-batches, but train.micro-batches is " + std::to_string(M));
  for (size_t s = 0; s < where.stages.size(); ++s) {
    const auto& nodes = where.stages[s].nodes;
    const auto counts = routed_micro_batches(where, static_cast<int>(s));
    const auto none = std::find(counts.begin(), counts.end(), 0);
    if (none == counts.end()) continue;
    std::string names;
    for (size_t r = 0; r < nodes.size(); ++r) names += (r ? ", " : "") + c.nodes.at(nodes[r]).name;
    if (M < static_cast<int64_t>(nodes.size()))
      throw std::runtime_error("the stage on nodes " + names + " has " + std::to_string(nodes.size()) +
                               " replicas but a step has only " + std::to_string(M) +
                               " micro-batches, so some replica would get none: raise train.micro-batches to at least " +
                               std::to_string(nodes.size()) + " (or give the stage fewer replicas)");
    // Enough micro-batches, but they are dealt by the replicas' measured speeds.
    throw std::runtime_error("the stage on nodes " + names + " deals a step's " + std::to_string(M) +
                             " micro-batches by its replicas' measured speeds, and node '" +
                             c.nodes.at(nodes[static_cast<size_t>(none - counts.begin())]).name +
                             "' is too slow to get one: raise train.micro-batches "
                             "or give the stage fewer replicas");
  }
}

namespace {

// Places the ops from st.exec.profile (cluster mode) and wires them.
void place_and_wire(coord_ptr self) {
  auto& st = self->state;
  if (st.phase == run_phase::failed) return;
  const graph& g = st.in->model;
  try {
    if (cluster_mode(st)) {
      choose_run_micro_batches(self);
      plan_compression(self);
      check_replica_routes(st);
    } else {
      st.exec.current = make_plan(g, placement{std::vector<int>(g.nodes.size(), 0)}, 1);
    }
    choose_run_schedule(self);
  } catch (const std::exception& e) {
    return fail(self, make_error(fusion_errc::bad_config, e.what()));
  }
  enter(self, run_phase::wiring);
  st.act = activity::wiring;
  spawn_ops(self, [=] {
    create_edges(self, self->state.exec.current.edges, [=] {
      connect_all(self, [=] {
        auto& s = self->state;
        if (cluster_mode(s) && s.in->cfg.progress)
          std::fprintf(stderr, "fusion-train: plan (%s):\n%s%s",
                       placement_policy_names()[static_cast<int>(s.in->cluster.placement.policy)].c_str(),
                       format_plan(s.in->model, s.in->cluster, s.exec.current).c_str(), describe_prediction(self).c_str());
        if (s.in->cfg.resume_from.empty()) return finish_start(self);
        load_checkpoint_async(self, s.in->cfg.resume_from, [=] { finish_start(self); });
      });
    });
  });
}

}  // namespace

// Every node has joined (or this is a one-process run): profile the cluster
// (actors/coordinator_profile.cpp), then place and wire.
void plan_and_wire(coord_ptr self) {
  enter(self, run_phase::planning);
  if (!cluster_mode(self->state)) return place_and_wire(self);
  prepare_profile(self, [=] { place_and_wire(self); });
}

// ---- joining ---------------------------------------------------------------------------------

// With credentials, a hello must carry the node's proof answering a nonce this coordinator
// issued (challenge_atom), by a node certificate naming the node of the hello.
static status check_node_proof(coordinator_state& st, const node_hello& h) {
  const auto& creds = st.in->cfg.credentials;
  if (!creds) return {};
  if (!st.members.challenges.redeem(h.proof.challenge))
    return fusion::fail(
        h.proof.certificate.empty()
            ? "a node saying it is '" + h.name + "' presented no certificate (is it running with security.mode=off?)"
            : "a node saying it is '" + h.name + "' answered no challenge of this coordinator (stale or replayed)");
  if (auto who = security::check_proof(*creds, h.proof, security::role::node, h.name); !who)
    return fusion::fail("a node saying it is '" + h.name + "' is not admitted: " + who.error());
  return {};
}

status check_node_identity(coordinator_state& st, const node_hello& h) {
  if (h.version != wire_protocol_version)
    return fusion::fail("node '" + h.name + "' speaks protocol version " + std::to_string(h.version) +
                        ", this coordinator speaks " + std::to_string(wire_protocol_version) + ": run the same build");
  if (auto admitted = check_node_proof(st, h); !admitted) return admitted;
  if (st.in->cluster.find_node(h.name) < 0)
    return fusion::fail("node '" + h.name + "' is not in cluster file " + st.in->cluster.file);
  return {};
}

caf::result<welcome_atom, int32_t, uint32_t> on_hello(coord_ptr self, node_hello& h, node_actor& node) {
  auto& st = self->state;
  const auto& cluster = st.in->cluster;
  std::string why;
  int idx = cluster.find_node(h.name);
  if (auto identity = check_node_identity(st, h); !identity)
    why = identity.error();
  else if (st.members.nodes[idx])
    why = "node '" + h.name + "' has already joined";
  else if (!same_device(h.device.substr(0, h.device.find(' ')), cluster.nodes[idx].device))
    why = "node '" + h.name + "' drives " + h.device + " but " + cluster.file + " gives it device " +
          cluster.nodes[idx].device + ": set [node] device in its config to match";
  if (!why.empty()) {
    std::fprintf(stderr, "fusion-train: refused a node: %s\n", why.c_str());
    return make_error(fusion_errc::refused, why);
  }
  st.members.nodes[idx] = node;
  st.members.hellos[idx] = h;
  st.members.node_state[idx] = "joined";
  self->monitor(node);
  ++st.members.joined;
  // Spares are not waited for: the run starts once every other node has joined.
  size_t required = 0;
  for (size_t i = 0; i < cluster.nodes.size(); ++i) required += !cluster.nodes[i].spare && st.members.nodes[i];
  if (st.in->cfg.progress)
    std::fprintf(stderr, "fusion-train: %s joined%s: %s, %.0f GFLOP/s, %.1f GiB, pid %d (%zu/%zu)\n",
                 node_label(st, idx).c_str(), cluster.nodes[idx].spare ? " (a spare)" : "", h.device.c_str(), h.gflops,
                 static_cast<double>(h.memory_bytes) / (1 << 30), h.pid, required, cluster.required_nodes());
  if (required == cluster.required_nodes() && !cluster.nodes[idx].spare) {
    ++st.timer;
    // Plan after this handler returns: the welcome goes out before the first spawn request.
    self->send(self, start_atom::value, true);
  }
  return {welcome_atom::value, static_cast<int32_t>(idx), wire_protocol_version};
}

// Nodes hold the coordinator's handle; admin requests must come through the admin actor (which
// checks the admin's certificate) or the local session, both in this process.
caf::error local_only(coord_ptr self, const char* what) {
  auto sender = self->current_sender();
  if (sender && sender->node() == self->node()) return {};
  return make_error(fusion_errc::refused, std::string("a remote peer sent an admin ") + what +
                                              " to the coordinator itself: use the admin shell (admin.port)");
}

// The other nodes' data-channel connections to a lost node are aborted: after a cut link
// nothing would ever close them (no FIN, no RST arrives), and a node that comes back on the same
// data port (node.data-port) must not be sent to over its old connections (docs/recovery.md,
// "A link cut"). No answer is awaited: the node actor handles it before anything sent later.
static void forget_lost_node(coord_ptr self, size_t lost) {
  auto& st = self->state;
  const auto& h = st.members.hellos[lost];
  if (h.name.empty()) return;
  for (auto& n : st.members.nodes)
    if (n) self->request(n, std::chrono::seconds(10), forget_peer_atom::value, h.name, h.host, h.data_port)
               .then([](bool) {}, [](caf::error&) {});
}

static void on_down(coord_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (size_t i = 0; i < st.members.nodes.size(); ++i) {
    if (!st.members.nodes[i] || st.members.nodes[i].address() != dm.source) continue;
    st.members.nodes[i] = nullptr;
    st.members.node_state[i] = st.phase == run_phase::finished ? "exited" : "lost";
    if (st.phase == run_phase::finished || st.phase == run_phase::failed) continue;
    forget_lost_node(self, i);
    if (lost_quietly(self, i, describe(dm.reason))) continue;
    if (abandon_migration_on_loss(self, i)) continue;
    if (recover_from_loss(self, i, describe(dm.reason))) continue;
    fail(self, make_error(fusion_errc::node_lost,
                          node_label(st, i) + " is gone (" + describe(dm.reason) +
                              "): it was killed, crashed or stopped answering heartbeats for " +
                              std::to_string(st.in->cfg.peer_timeout_ms) + " ms"));
  }
}

void begin_join(coord_ptr self) {
  auto& st = self->state;
  publish_admin(self);
  if (st.phase == run_phase::failed) return;  // the admin port could not be opened
  if (!cluster_mode(st)) return plan_and_wire(self);
  const auto& cluster = st.in->cluster;
  std::string host = cluster.coordinator_host;
  uint16_t port = static_cast<uint16_t>(cluster.coordinator_port);
  if (!st.in->cfg.listen.empty()) std::tie(host, port) = parse_host_port(st.in->cfg.listen, "cluster.listen");
  const bool tls = st.in->cfg.credentials != nullptr;
  auto bound = publish_actor(caf::actor_cast<caf::actor>(self), port, host, tls);
  if (!bound)
    return fail(self, make_error(fusion_errc::bad_config, "cannot listen for nodes on " + host + ":" +
                                                              std::to_string(port) + ": " + describe(bound.error())));
  st.members.nodes.assign(cluster.nodes.size(), node_actor{});
  st.members.hellos.assign(cluster.nodes.size(), {});
  st.members.node_state.assign(cluster.nodes.size(), "waiting");
  for (size_t i = 0; i < cluster.nodes.size(); ++i)
    if (cluster.nodes[i].spare) st.members.node_state[i] = "spare";
  st.act = activity::joining;
  if (st.in->cfg.progress)
    std::fprintf(stderr, "fusion-train: waiting for %zu node(s) of %s on %s:%u (%s)\n", cluster.required_nodes(),
                 cluster.file.c_str(), host.c_str(), static_cast<unsigned>(*bound),
                 tls ? "mutual TLS, admission by certificate" : "PLAINTEXT, unauthenticated");
  if (st.in->cfg.on_listening) st.in->cfg.on_listening(*bound);
  arm_timeout(self, st.in->cfg.join_timeout_s);
}

void fail(coord_ptr self, const caf::error& e) {
  auto& st = self->state;
  if (st.phase == run_phase::failed) return;
  auto err = code_of(e) == fusion_errc::none ? make_error(fusion_errc::op_failed, describe(e)) : e;
  std::string msg = describe(err);
  if (!st.train.last_checkpoint.empty() && code_of(err) != fusion_errc::interrupted)
    msg += " (last checkpoint: " + st.train.last_checkpoint + ")";
  st.failure = msg;
  enter(self, run_phase::failed);
  st.act = activity::idle;
  ++st.timer;
  auto out = make_error(code_of(err), msg);
  for (auto* rp : {&st.pending.start_rp, &st.pending.train_rp, &st.pending.pass_rp, &st.pending.pause_rp})
    if (rp->pending()) rp->deliver(out);
  for (auto& rp : st.pending.rewire_rps)
    if (rp.pending()) rp.deliver(out);
  st.pending.rewire_rps.clear();
  refuse_boundary_tasks(self, out);
  end_migration(self, out);
}

void arm_timeout(coord_ptr self, double seconds) {
  auto token = ++self->state.timer;
  self->delayed_send(self, ms_of(seconds), timeout_atom::value, token);
}

// Replaces every cross-node edge by a fresh one (new ids, new edge senders) between two steps:
// the new senders and routes first, then every op actor learns its new neighbours, then the old
// routes and senders go. Migration applies general plan diffs the same way.
void apply_rewire(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  plan next = renumber(st.exec.current, st.exec.current.next_edge_id);
  plan_diff d = diff(st.exec.current, next);
  std::vector<plan_edge> add = d.added, drop = d.removed;
  for (auto& [before, after] : d.changed) add.push_back(after), drop.push_back(before);
  auto old_plan = std::make_shared<plan>(st.exec.current);
  st.exec.current = std::move(next);
  st.act = activity::wiring;
  create_edges(self, add, [=] {
    connect_all(self, [=] {
      drop_edges(self, drop, [=] {
        self->state.act = activity::idle;
        if (self->state.in->cfg.progress)
          std::fprintf(stderr, "fusion-train: re-wired at step %lld: %s\n", static_cast<long long>(self->state.train.step),
                       format_diff(self->state.in->model, self->state.in->cluster, diff(*old_plan, self->state.exec.current))
                           .c_str());
        done();
      });
    });
  });
}

void shutdown_nodes(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  if (st.phase != run_phase::failed) enter(self, run_phase::finished);
  for (auto& a : st.exec.actors)
    if (a && !cluster_mode(st)) self->send_exit(a, caf::exit_reason::user_shutdown);
  if (st.admin) self->send_exit(st.admin, caf::exit_reason::user_shutdown);
  std::vector<node_actor> live;
  for (auto& n : st.members.nodes)
    if (n) live.push_back(n);
  if (live.empty()) return done();
  auto left = std::make_shared<size_t>(live.size());
  // After a failure a node may be the hung one: do not wait long for it.
  auto timeout = st.phase == run_phase::failed ? std::chrono::seconds(1) : std::chrono::seconds(5);
  for (auto& n : live)
    self->request(n, timeout, shutdown_atom::value)
        .then([=](bool) { if (--*left == 0) done(); }, [=](caf::error&) { if (--*left == 0) done(); });
}

void request_stop(coord_ptr self) {
  auto& s = self->state;
  if (s.train.stop_requested || s.phase == run_phase::failed || s.phase == run_phase::finished) return;
  s.train.stop_requested = true;
  switch (s.phase) {
    case run_phase::training:
      // Between steps (evaluating or checkpointing), begin_step sees the request and stops.
      if (!s.train.cur) return;
      s.train.stop_deadline = clock_type::now() + ms_of(s.in->cfg.stop_grace_s);
      self->delayed_send(self, ms_of(s.in->cfg.stop_grace_s), stop_atom::value, uint64_t{s.timer});
      return;
    case run_phase::paused:
      if (s.train.training_job) finish_training(self, true);
      return;
    case run_phase::ready: return;
    default: fail(self, make_error(fusion_errc::interrupted, std::string("interrupted while ") + to_string(s.phase)));
  }
}

void join_timed_out(coord_ptr self) {
  auto& s = self->state;
  std::string missing;
  for (size_t i = 0; i < s.members.nodes.size(); ++i)
    if (!s.members.nodes[i] && !s.in->cluster.nodes[i].spare)
      missing += (missing.empty() ? "" : ", ") + s.in->cluster.nodes[i].name;
  fail(self, make_error(fusion_errc::timeout, "node(s) " + missing + " of " + s.in->cluster.file +
                                                  " did not join within " + format_seconds(s.in->cfg.join_timeout_s) +
                                                  " (cluster.join-timeout); start them with fusion-node --config "
                                                  "configs/nodes/..."));
}

namespace {

caf::behavior coordinator_fn(coord_ptr self, std::shared_ptr<run_inputs> in) {
  auto& st = self->state;
  st.in = std::move(in);
  st.exec.micro_rows = st.in->cfg.batch / st.in->cfg.micro_batches;
  st.rebalance.settings = st.in->cfg.rebalance;
  for (auto& n : st.in->model.nodes)
    if (!n.is_input()) st.exec.compute_nodes.push_back(n.id);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  // Pure code (data, checkpoints, plans) throws in plain words: the run fails with that message
  // and every waiting request hears of it, instead of the actor dying silently.
  self->set_exception_handler([=](std::exception_ptr& p) -> caf::error {
    std::string what = "an unknown error";
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      what = "out of memory";
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    fail(self, make_error(fusion_errc::bad_config, what));
    return make_error(fusion_errc::bad_config, what);
  });
  set_out_of_phase_handler(self);
  // The stop flag is raised by a signal handler, which may not send messages: poll it.
  self->delayed_send(self, std::chrono::milliseconds(100), stop_atom::value, true);
  st.phase = run_phase::joining;
  return phase_behavior(self, run_phase::joining);
}

}  // namespace

coordinator_session spawn_coordinator(caf::actor_system& sys, std::shared_ptr<run_inputs> inputs) {
  return caf::actor_cast<coordinator_session>(sys.spawn(coordinator_fn, std::move(inputs)));
}

}  // namespace fusion
