// Peer-held snapshots (recovery.snapshot-every, docs/recovery.md): the coordinator's side.
//
// Per op, not per node: the op actor already hands its state over tensor by tensor through any
// tensor sink (export_atom, as a migration does), so a snapshot is one export_atom per op, sent
// right after the optimizer update of the step. The coordinator sends it before the next step's
// update request to the same actor, so the state exported is that of the step's end (one sender,
// one mailbox, in order); the forward passes of the next step run meanwhile and change no
// parameter or moment. The op exports into a holder on its own node (a local, in-process copy:
// the survivors' ops rewind from there when the buddy is the node lost), which passes every
// tensor on to an edge sender towards the holder on the buddy node, over the data channel like
// any cross-node tensor, and sends it the checksum once the snapshot is whole. No reply is
// waited for: training goes on while the tensors travel.
#include <algorithm>
#include <set>
#include <utility>

#include "actors/coordinator_state.hpp"
#include "actors/op_actor.hpp"
#include "actors/op_device.hpp"
#include "core/log.hpp"
#include "core/snapshot_store.hpp"

namespace fusion {

namespace {

const auto control_timeout = std::chrono::seconds(10);

bool wanted(const coordinator_state& st) {
  return st.in->cfg.snapshot_every > 0 && !st.in->cluster.nodes.empty() && recovery_enabled(st);
}

// The node of every op (by compute_nodes index), then every node's usability: holders are made
// again when either changes (a buddy drained or admitted changes the buddies, not the ops' nodes).
std::vector<int> placed_now(const coordinator_state& st) {
  std::vector<int> out;
  for (int id : st.exec.compute_nodes) out.push_back(st.exec.current.where.node_of(id, 0));
  for (size_t i = 0; i < st.in->cluster.nodes.size(); ++i) out.push_back(usable_node(st, i) ? 1 : 0);
  return out;
}

// The build under way is over (holders ready, or snapshots off): whoever waits for it goes on.
void build_ended(snapshot_state& sn) {
  auto waiting = std::exchange(sn.when_built, {});
  for (auto& f : waiting) f();
}

void snapshots_off(coord_ptr self, const std::string& why) {
  auto& sn = self->state.snap;
  sn.ready = sn.building = false;
  if (sn.off != why)
    log_warn("fusion-train", "peer snapshots are off: " + why +
                                 "; a lost node's state comes from a surviving replica or the last checkpoint");
  sn.off = why;
  build_ended(sn);
}

// Stops the holders and removes the edges of `routes`; errors are ignored (a node may be gone).
void release(coord_ptr self, const std::vector<snapshot_route>& routes) {
  auto& st = self->state;
  auto ignore = [](auto handle) { handle.then([](bool) {}, [](caf::error&) {}); };
  for (auto& r : routes) {
    if (r.local) self->send(r.local, stop_atom::value);
    if (r.remote) self->send(r.remote, stop_atom::value);
    if (r.edge == 0) continue;
    if (st.members.nodes[r.buddy]) ignore(self->request(st.members.nodes[r.buddy], control_timeout, unroute_atom::value, r.edge));
    if (st.members.nodes[r.node]) ignore(self->request(st.members.nodes[r.node], control_timeout, drop_atom::value, r.edge));
  }
}

std::vector<std::string> keys_of(const coordinator_state& st, int op) {
  const node_spec spec = make_node_spec(st.in->model, op);
  // Under local steps (train.sync=local:H) every op also holds the outer state.
  return state_key_names(spec.name, spec.kind, attr_map{spec.attrs}, spec.input_shapes, st.in->cfg.optim.sync_every > 0);
}

// "n0 (site a) -> n1 (site b), n1 (site b) -> n2 (site c), ..." for the log.
std::string pairs_of(const coordinator_state& st, const std::vector<snapshot_route>& routes) {
  std::set<std::pair<int, int>> pairs;
  for (auto& r : routes) pairs.insert({r.node, r.buddy});
  std::string out;
  const auto& c = st.in->cluster;
  for (auto& [a, b] : pairs)
    out += (out.empty() ? "" : ", ") + c.nodes[a].name + " (site " + c.nodes[a].site + ") -> " + c.nodes[b].name +
           " (site " + c.nodes[b].site + ")";
  return out;
}

// The last part of the build: the holders on the ops' own nodes, which feed the edges.
void make_local_holders(coord_ptr self, uint64_t gen, std::shared_ptr<std::vector<snapshot_route>> routes,
                        std::function<void(caf::error&)> on_error) {
  gather<snapshot_holder>(self, routes->size(), [=](size_t i) {
    auto& s = self->state;
    const auto& r = (*routes)[i];
    return self->request(s.members.nodes[r.node], control_timeout, hold_atom::value, s.in->model.nodes[r.op].name,
                         r.tensors, snapshot_keep_local, s.exec.senders.at(r.edge), r.remote);
  }, [=](std::vector<snapshot_holder> local) {
    auto& s = self->state;
    // The snapshot edges are no edges of the plan: the plan's bookkeeping does not see them.
    for (auto& r : *routes) s.exec.senders.erase(r.edge);
    for (size_t i = 0; i < local.size(); ++i) (*routes)[i].local = local[i];
    if (s.snap.generation != gen) return release(self, *routes);
    s.snap.routes = std::move(*routes);
    s.snap.ready = true;
    s.snap.building = false;
    s.snap.off.clear();
    log_info("fusion-train", "peer snapshots every " + std::to_string(s.in->cfg.snapshot_every) +
                                 " step(s), each node's ops to its buddy: " + pairs_of(s, s.snap.routes));
    build_ended(s.snap);
  }, on_error);
}

}  // namespace

bool snapshots_ready(const coordinator_state& st) { return st.snap.ready; }

void prepare_snapshots(coord_ptr self, std::function<void()> built) {
  auto& st = self->state;
  auto& sn = st.snap;
  if (!wanted(st)) {
    if (built) built();
    return;
  }
  if (built) sn.when_built.push_back(std::move(built));
  if (sn.building && sn.build_epoch == st.epoch) return;
  // Made already, or refused for this very plan (said once): nothing to do until the plan changes.
  if ((sn.ready || !sn.off.empty()) && sn.placed == placed_now(st)) return build_ended(sn);
  release(self, sn.routes);
  sn.routes.clear();
  sn.ready = false;
  const uint64_t gen = ++sn.generation;
  sn.building = true;
  sn.build_epoch = st.epoch;
  sn.placed = placed_now(st);
  const auto& c = st.in->cluster;
  std::vector<std::string> sites;
  std::vector<bool> alive;
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    sites.push_back(c.nodes[i].site);
    // A node still being admitted, or being drained, holds no one's snapshots.
    alive.push_back(usable_node(st, i));
  }
  const auto buddies = snapshot_buddies(sites, alive);
  auto routes = std::make_shared<std::vector<snapshot_route>>();
  try {
    for (size_t k = 0; k < st.exec.compute_nodes.size(); ++k) {
      const int op = st.exec.compute_nodes[k], node = sn.placed[k];
      const auto keys = keys_of(st, op);
      if (keys.empty()) continue;  // no state: nothing to keep
      if (buddies[node] < 0) return snapshots_off(self, node_label(st, node) + " has no other node to hold its snapshots");
      snapshot_route r;
      r.op = op;
      r.node = node;
      r.buddy = buddies[node];
      r.tensors = static_cast<uint32_t>(keys.size());
      routes->push_back(r);
    }
  } catch (const std::exception& e) {
    return snapshots_off(self, e.what());
  }
  // The edge ids are taken now, not when the holders answer: a plan derived from the current
  // one meanwhile (a migration at this boundary, a recovery) then numbers its edges past them.
  // Taken later, they once collided with that plan's edges (a route or sender overwritten).
  for (auto& r : *routes) r.edge = st.exec.current.next_edge_id++;
  auto on_error = [=](caf::error& e) {
    if (self->state.snap.generation == gen) snapshots_off(self, "their holders could not be made (" + describe(e) + ")");
  };
  // First the holders on the buddies, then the edges that end there, then the ops' own holders.
  gather<snapshot_holder>(self, routes->size(), [=](size_t i) {
    auto& s = self->state;
    const auto& r = (*routes)[i];
    return self->request(s.members.nodes[r.buddy], control_timeout, hold_atom::value, s.in->model.nodes[r.op].name,
                         r.tensors, snapshot_keep_buddy, edge_sender_actor{}, snapshot_holder{});
  }, [=](std::vector<snapshot_holder> remote) {
    auto& s = self->state;
    std::vector<plan_edge> edges;
    for (size_t i = 0; i < remote.size(); ++i) {
      auto& r = (*routes)[i];
      r.remote = remote[i];
      plan_edge e;
      e.id = r.edge;
      e.producer = e.consumer = r.op;
      e.from = r.node;
      e.to = r.buddy;
      edges.push_back(e);
    }
    if (s.snap.generation != gen) return release(self, *routes);
    auto target_of = [routes](const plan_edge& e) -> tensor_sink {
      for (auto& r : *routes)
        if (r.edge == e.id) return r.remote;
      return {};
    };
    create_edges(self, std::move(edges), [=] { make_local_holders(self, gen, routes, on_error); }, on_error, target_of);
  }, on_error);
}

void renew_snapshots(coord_ptr self, std::function<void()> built) {
  auto& sn = self->state.snap;
  if (sn.ready || sn.building) {
    release(self, sn.routes);
    sn.routes.clear();
    sn.placed.clear();
    sn.ready = sn.building = false;
    ++sn.generation;  // a build under way releases what it made
  }
  prepare_snapshots(self, std::move(built));
}

void maybe_snapshot(coord_ptr self) {
  auto& st = self->state;
  auto& sn = st.snap;
  if (!wanted(st)) return;
  if (!sn.ready || sn.placed != placed_now(st)) return prepare_snapshots(self);
  if (st.train.step % st.in->cfg.snapshot_every != 0) return;
  const uint64_t step = static_cast<uint64_t>(st.train.step);
  ++sn.taken;
  // No timeout: CAF 0.17 keeps a request's timeout alive until it expires (coordinator_train.cpp
  // says why that matters); a lost op actor answers with an error all the same.
  for (auto& r : sn.routes)
    self->request(st.exec.actors[r.op], caf::infinite, export_atom::value, tensor_sink{r.local}, step)
        .then([](state_export&) {}, [](caf::error&) {
          // The op's node was lost, or the op moved: the recovery or the next build sees to it.
        });
}

void restore_from_snapshots(coord_ptr self, std::vector<bool> alive, std::function<void(snapshot_restore)> done,
                            std::function<void(const std::string&)> failed) {
  auto& st = self->state;
  if (!st.snap.ready)
    return failed(st.snap.off.empty() ? std::string("no snapshot holders were ready yet") : st.snap.off);
  struct ask {
    size_t route;
    snapshot_holder holder;
    int node;
  };
  auto routes = std::make_shared<std::vector<snapshot_route>>(st.snap.routes);
  auto asks = std::make_shared<std::vector<ask>>();
  for (size_t i = 0; i < routes->size(); ++i) {
    const auto& r = (*routes)[i];
    if (alive[r.buddy]) asks->push_back({i, r.remote, r.buddy});
    if (alive[r.node]) asks->push_back({i, r.local, r.node});
  }
  const auto timeout = ms_of(st.in->cfg.step_timeout_s);
  gather<std::vector<uint64_t>>(self, asks->size(), [=](size_t k) {
    return self->request((*asks)[k].holder, control_timeout, held_atom::value);
  }, [=](std::vector<std::vector<uint64_t>> got) {
    auto& s = self->state;
    std::vector<std::vector<uint64_t>> held(routes->size());
    for (size_t k = 0; k < got.size(); ++k) {
      auto& into = held[(*asks)[k].route];
      into.insert(into.end(), got[k].begin(), got[k].end());
    }
    const auto step = newest_common_step(held);
    if (!step) {
      std::vector<std::string> without;
      for (size_t i = 0; i < held.size(); ++i)
        if (held[i].empty()) without.push_back(s.in->model.nodes[(*routes)[i].op].name);
      std::string why = "no step has a complete snapshot of every op on the surviving nodes";
      if (!without.empty()) {
        why += " (none of op";
        for (size_t i = 0; i < without.size() && i < 4; ++i) why += (i ? ", " : " ") + without[i];
        why += without.size() > 4 ? ", ...)" : ")";
      }
      return failed(why);
    }
    // One holder per op that has the step: the buddy's first (asks lists it first).
    auto picks = std::make_shared<std::vector<size_t>>(routes->size(), 0);
    for (size_t i = 0; i < routes->size(); ++i)
      for (size_t k = asks->size(); k-- > 0;)
        if ((*asks)[k].route == i && std::count(got[k].begin(), got[k].end(), *step)) (*picks)[i] = k;
    gather<std::vector<tensor>>(self, routes->size(), [=](size_t i) {
      return self->request((*asks)[(*picks)[i]].holder, timeout, fetch_atom::value, *step);
    }, [=](std::vector<std::vector<tensor>> states) {
      auto& s2 = self->state;
      snapshot_restore out;
      out.step = *step;
      std::set<std::string> by;
      for (size_t i = 0; i < states.size(); ++i) {
        const int op = (*routes)[i].op;
        auto keys = keys_of(s2, op);
        if (keys.size() != states[i].size())
          return failed("the snapshot of op '" + s2.in->model.nodes[op].name + "' has " +
                        std::to_string(states[i].size()) + " tensors, the op " + std::to_string(keys.size()));
        named_tensors named;
        for (size_t j = 0; j < keys.size(); ++j) named.emplace_back(keys[j], std::move(states[i][j]));
        out.states[op] = std::move(named);
        by.insert(s2.in->cluster.nodes[(*asks)[(*picks)[i]].node].name);
      }
      for (int op : s2.exec.compute_nodes) out.states.try_emplace(op);  // ops without state
      for (auto& n : by) out.held_by += (out.held_by.empty() ? "" : ", ") + n;
      done(std::move(out));
    }, [=](caf::error& e) { failed("a holder could not hand its snapshot over (" + describe(e) + ")"); });
  }, [=](caf::error& e) { failed("a holder did not say what it holds (" + describe(e) + ")"); });
}

}  // namespace fusion
