// Membership of a running job (docs/distributed.md, "Joining a running job"; docs/admin.md,
// `drain`). A node that says hello once the run is wired (a spare of the cluster file, a node
// that was lost or drained and comes back) is checked as at start (protocol, certificate, name,
// device), welcomed, then profiled in the background while training goes on: the same op
// timings and link probes as at join. At the next step boundary its profile enters the cluster
// view (the coordinator's profile and the estimator) and the node is offered to the scheduler,
// which moves work onto it when the re-plan pays after the migration's cost. `drain NODE` is the
// reverse: its ops migrate to the other nodes (the run's placement policy on them, memory
// checked), then the node is told to leave; the run goes on.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "actors/coordinator_state.hpp"
#include "core/graph_names.hpp"
#include "core/log.hpp"
#include "core/metrics_record.hpp"
#include "core/wire.hpp"
#include "scheduler/op_timing.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/survivors.hpp"
#include "tensor/device.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

/// One node joining the running job.
struct admission_ctx {
  size_t node = 0;
  uint64_t serial = 0;
  std::string before;                   // its state when it said hello ("spare", "lost", ...)
  clock_type::time_point t0;            // the hello
  int64_t asked_step = 0;
  node_profile prof;                    // what profiling measured
  std::vector<link_profile> links;      // the site pairs probed for it
  std::vector<std::string> notes;       // links not probed, in plain words
  double profile_s = 0;                 // hello to profile done
};

namespace {

// Profiling one node takes about a second; a node silent for this long is stuck.
constexpr auto profile_timeout = std::chrono::seconds(120);
constexpr uint32_t probe_warmup_ms = 200, probe_window_ms = 500;
constexpr auto probe_timeout = std::chrono::seconds(15);
constexpr auto leave_timeout = std::chrono::seconds(10);

bool wired_phase(const coordinator_state& st) {
  return st.phase == run_phase::ready || st.phase == run_phase::training || st.phase == run_phase::paused;
}

bool opfence_scheduled(const coordinator_state& st) {
  return st.rebalance.settings.enabled && is_opfence(st.in->cluster.placement.policy);
}

std::shared_ptr<admission_ctx> admission_of(coordinator_state& st, size_t node, uint64_t serial) {
  auto it = st.members.admitting.find(node);
  if (it == st.members.admitting.end() || it->second->serial != serial || !st.members.nodes[node]) return nullptr;
  return it->second;
}

std::string names_of(const coordinator_state& st, const std::vector<bool>& which) {
  std::string out;
  for (size_t i = 0; i < which.size(); ++i)
    if (which[i]) out += (out.empty() ? "" : ", ") + st.in->cluster.nodes[i].name;
  return out;
}

void write_record(coord_ptr self, const json& rec) {
  auto& st = self->state;
  if (st.train.metrics.is_open()) st.train.metrics << rec.dump() << '\n' << std::flush;
}

// Says why the admission of `a` ended without the node and tells the node to leave.
void drop_joiner(coord_ptr self, std::shared_ptr<admission_ctx> a, const std::string& why) {
  auto& st = self->state;
  st.members.admitting.erase(a->node);
  auto node = st.members.nodes[a->node];
  log_warn("fusion-train", node_label(st, a->node) + " was not admitted: " + why);
  if (!node) return;
  self->demonitor(node.address());
  st.members.nodes[a->node] = nullptr;
  st.members.node_state[a->node] = a->before;
  self->request(node, leave_timeout, shutdown_atom::value).then([](bool) {}, [](caf::error&) {});
}

// The cluster view takes the node: its profile, the estimator, the scheduler's next judgement.
void admit_now(coord_ptr self, std::shared_ptr<admission_ctx> a, std::function<void()> next) {
  auto& st = self->state;
  if (admission_of(st, a->node, a->serial) != a) return next();
  const auto t0 = clock_type::now();
  const auto& c = st.in->cluster;
  if (st.exec.profile.nodes.size() != c.nodes.size()) {
    auto micro_batches = st.exec.profile.micro_batches;
    st.exec.profile = profile_from_cluster(c);
    st.exec.profile.micro_batches = micro_batches;
  }
  st.exec.profile.nodes[a->node] = a->prof;
  for (auto& l : a->links) {
    auto& links = st.exec.profile.links;
    auto it = std::find_if(links.begin(), links.end(), [&](const link_profile& x) {
      return std::minmax(x.site_a, x.site_b) == std::minmax(l.site_a, l.site_b);
    });
    if (it != links.end())
      *it = l;
    else
      links.push_back(l);
  }
  if (auto* est = estimator_of(self)) est->admit_node(static_cast<int>(a->node), a->prof, a->links);
  st.members.admitting.erase(a->node);
  st.members.node_state[a->node] = "joined";
  const double pause_s = seconds_between(t0, clock_type::now());
  const bool rejoin = a->before != "spare" && a->before != "waiting";
  const bool offered = opfence_scheduled(st) && st.train.step < st.in->cfg.steps;
  if (offered) st.rebalance.offer = true;
  const auto& h = st.members.hellos[a->node];
  char timing[160];
  std::snprintf(timing, sizeof timing, "profiled in %.2f s in the background, %.3f s at the step boundary",
                a->profile_s, pause_s);
  std::string line = node_label(st, a->node) + (rejoin ? " rejoined" : " joined") + " the running job at step " +
                     std::to_string(st.train.step) + (rejoin ? " (it was " + a->before + ")" : "") + ": " + h.device +
                     ", " + std::to_string(static_cast<int>(h.gflops)) + " GFLOP/s, " + timing + "; " +
                     (offered ? "offered to the scheduler, which moves work onto it when that pays"
                              : "the scheduler does not move work under placement policy '" +
                                    placement_policy_names()[static_cast<int>(c.placement.policy)] +
                                    "' (or is off): 'move OP NODE' puts ops on it");
  log_info("fusion-train", line);
  for (auto& n : a->notes) log_warn("fusion-train", n);
  json links = json::array();
  for (auto& l : a->links)
    links.push_back({{"sites", c.sites[l.site_a].name + " - " + c.sites[l.site_b].name}, {"mbit", l.mbit},
                     {"rtt_s", l.rtt_s}});
  write_record(self, {{"type", "join"}, {"time", metrics_time()}, {"step", st.train.step}, {"node", c.nodes[a->node].name},
                      {"site", c.nodes[a->node].site}, {"rejoin", rejoin}, {"was", a->before}, {"device", h.device},
                      {"gflops", h.gflops}, {"memory_bytes", h.memory_bytes}, {"asked_at_step", a->asked_step},
                      {"profile_s", a->profile_s}, {"pause_s", pause_s}, {"links", links}, {"offered", offered}});
  next();
}

// Admission at the next step boundary (now, when no step runs and nothing else is in flight).
void queue_admission(coord_ptr self, std::shared_ptr<admission_ctx> a) {
  auto& st = self->state;
  a->profile_s = seconds_between(a->t0, clock_type::now());
  const bool idle = st.phase != run_phase::training && st.act == activity::idle && st.rebalance.at_boundary.empty();
  st.rebalance.at_boundary.push_back({[=](std::function<void()> next) { admit_now(self, a, next); },
                                      [](const caf::error&) {}});
  if (idle) run_boundary_tasks(self, [] {});
}

// Probes the link from the joiner's site to each site in `peers` (one node each), one at a time
// as at join, so no link carries two probes.
void probe_next(coord_ptr self, std::shared_ptr<admission_ctx> a, std::shared_ptr<std::vector<size_t>> peers, size_t k) {
  auto& st = self->state;
  if (admission_of(st, a->node, a->serial) != a) return;
  if (k >= peers->size()) return queue_admission(self, a);
  const auto& c = st.in->cluster;
  size_t from = a->node, to = (*peers)[k];
  auto reachable = [&](size_t n) { return st.members.hellos[n].data_port != 0 && c.nodes[n].accept_inbound; };
  if (!reachable(to)) std::swap(from, to);
  const int sa = c.nodes[a->node].site_index, sb = c.nodes[(*peers)[k]].site_index;
  const std::string pair = c.sites[sa].name + " - " + c.sites[sb].name;
  if (!reachable(to)) {
    a->notes.push_back("link " + pair + " not probed: neither node '" + c.nodes[from].name + "' nor node '" +
                       c.nodes[to].name + "' accepts inbound data channel connections; the cluster file's rate stands");
    return probe_next(self, a, peers, k + 1);
  }
  const auto& peer = st.members.hellos[to];
  self->request(st.members.nodes[from], probe_timeout, probe_atom::value, peer.name, peer.host, peer.data_port,
                probe_warmup_ms, probe_window_ms)
      .then(
          [=](double mbit, double rtt_s) {
            link_profile l;
            l.site_a = std::min(sa, sb);
            l.site_b = std::max(sa, sb);
            l.mbit = mbit;
            l.rtt_s = rtt_s;
            l.measured = true;
            a->links.push_back(l);
            probe_next(self, a, peers, k + 1);
          },
          [=](caf::error& e) {
            a->notes.push_back("link " + pair + " not probed (" + describe(e) + "); the cluster file's rate stands");
            probe_next(self, a, peers, k + 1);
          });
}

}  // namespace

bool holds_ops(const coordinator_state& st, size_t node) {
  const auto& w = st.exec.current.where;
  for (size_t id = 0; id < w.node_of_op.size(); ++id)
    for (int r = 0; r < w.replicas(static_cast<int>(id)); ++r)
      if (w.node_of(static_cast<int>(id), r) == static_cast<int>(node)) return true;
  return false;
}

bool usable_node(const coordinator_state& st, size_t i) {
  return i < st.members.nodes.size() && st.members.nodes[i] && st.members.node_state[i] == "joined";
}

std::vector<bool> usable_nodes(const coordinator_state& st) {
  std::vector<bool> out(st.in->cluster.nodes.size(), false);
  for (size_t i = 0; i < out.size(); ++i) out[i] = usable_node(st, i);
  return out;
}

caf::result<welcome_atom, int32_t, uint32_t> on_late_hello(coord_ptr self, node_hello& h, node_actor& node) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  std::string why;
  const int idx = c.find_node(h.name);
  if (auto identity = check_node_identity(st, h); !identity)
    why = identity.error();
  else if (st.members.nodes[idx])
    why = "node '" + h.name + "' is already in the run (" + st.members.node_state[idx] + ")";
  else if (!same_device(h.device.substr(0, h.device.find(' ')), c.nodes[idx].device))
    why = "node '" + h.name + "' drives " + h.device + " but " + c.file + " gives it device " + c.nodes[idx].device +
          ": set [node] device in its config to match";
  else if (st.train.stop_requested)
    why = "node '" + h.name + "' comes while the run is stopping";
  if (!why.empty()) {
    std::fprintf(stderr, "fusion-train: refused a node: %s\n", why.c_str());
    return make_error(fusion_errc::refused, why);
  }
  auto a = std::make_shared<admission_ctx>();
  a->node = static_cast<size_t>(idx);
  a->serial = ++st.members.admissions;
  a->before = st.members.node_state[idx];
  a->t0 = clock_type::now();
  a->asked_step = st.train.step;
  st.members.nodes[idx] = node;
  st.members.hellos[idx] = h;
  st.members.node_state[idx] = "admitting";
  st.members.admitting[a->node] = a;
  self->monitor(node);
  log_info("fusion-train", node_label(st, a->node) + " asks to join the running job at step " +
                               std::to_string(st.train.step) + " (it was " + a->before +
                               "): profiling it in the background; it is admitted at the next step boundary");
  // Profiled once this handler returned: the welcome reaches the node before the first request.
  self->send(self, admit_atom::value, static_cast<int32_t>(idx), a->serial);
  return {welcome_atom::value, static_cast<int32_t>(idx), wire_protocol_version};
}

void profile_joiner(coord_ptr self, size_t node, uint64_t serial) {
  auto& st = self->state;
  auto a = admission_of(st, node, serial);
  if (!a) return;
  const auto& c = st.in->cluster;
  a->prof = st.exec.profile.nodes.size() == c.nodes.size() ? st.exec.profile.nodes[node] : profile_from_cluster(c).nodes[node];
  const auto& h = st.members.hellos[node];
  if (c.nodes[node].gflops <= 0) a->prof.gflops = h.gflops;
  if (c.nodes[node].memory_gib <= 0) a->prof.memory_bytes = h.memory_bytes;
  self->request(st.members.nodes[node], profile_timeout, profile_atom::value, op_signatures(st.in->model))
      .then(
          [=](device_timing& t) {
            auto& s = self->state;
            if (admission_of(s, a->node, a->serial) != a) return;
            const uint64_t free = t.memory_bytes;
            take_measured(a->prof, std::move(t));
            if (s.in->cluster.nodes[a->node].memory_gib <= 0 && free > 0) a->prof.memory_bytes = free;
            // The links of its site were probed already when another node of the site takes part.
            const auto& cl = s.in->cluster;
            const int mine = cl.nodes[a->node].site_index;
            auto peers = std::make_shared<std::vector<size_t>>();
            bool site_known = false;
            std::vector<bool> site_taken(cl.sites.size(), false);
            for (size_t i = 0; i < cl.nodes.size(); ++i) {
              if (i == a->node || !usable_node(s, i)) continue;
              const int site = cl.nodes[i].site_index;
              if (site == mine) site_known = true;
              if (site != mine && !site_taken[site]) site_taken[site] = true, peers->push_back(i);
            }
            if (site_known) peers->clear();
            probe_next(self, a, peers, 0);
          },
          [=](caf::error& e) {
            auto& s = self->state;
            if (admission_of(s, a->node, a->serial) != a) return;
            drop_joiner(self, a, "profiling it failed (" + describe(e) + ")");
          });
}

bool lost_quietly(coord_ptr self, size_t node, const std::string& why) {
  auto& st = self->state;
  if (auto it = st.members.admitting.find(node); it != st.members.admitting.end()) {
    st.members.admitting.erase(it);
    log_warn("fusion-train", node_label(st, node) + " was lost while it was being admitted (" + why +
                                 "): it held no operator, nothing to recover; the run goes on");
    return true;
  }
  return false;
}

// ---- drain ---------------------------------------------------------------------------------

namespace {

caf::error bad(const std::string& what) { return make_error(fusion_errc::bad_command, what); }

// The placement without `node`: the run's policy on the other usable nodes, memory checked.
std::optional<placement> placement_without(coord_ptr self, size_t node, caf::error& err) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  auto usable = usable_nodes(st);
  usable[node] = false;
  cluster_profile profile = st.exec.profile;
  if (profile.nodes.size() != c.nodes.size()) profile = profile_from_cluster(c);
  profile.micro_batches = static_cast<int>(st.in->cfg.micro_batches);
  try {
    auto* est = estimator_of(self);
    // OP-Fence with what the run measured, as the scheduler re-plans; the other policies as a
    // recovery re-plans on the survivors.
    placement where = est && is_opfence(c.placement.policy)
                          ? place_on_usable(*est, usable, st.in->cfg.compression, st.exec.current.schedule)
                          : place_on_survivors(st.in->model, c, est ? est->profile() : profile, usable,
                                               st.in->cfg.compression, st.exec.current.schedule).where;
    if (auto short_of = short_of_memory(self, where)) {
      err = bad("not enough memory to drain node '" + c.nodes[node].name + "': node '" + c.nodes[short_of->node].name +
                "' has " + human_bytes(short_of->have) + ", its ops would need " + human_bytes(short_of->need) +
                "; nothing moved");
      return std::nullopt;
    }
    return where;
  } catch (const std::exception& e) {
    err = bad("cannot place the ops of node '" + c.nodes[node].name + "' on " + names_of(st, usable) + ": " + e.what() +
              "; nothing moved");
    return std::nullopt;
  }
}

// The node holds no op any more: it is told to leave, and the run goes on without it.
void let_leave(coord_ptr self, size_t node, std::string moved, clock_type::time_point t0, caf::response_promise rp,
               std::function<void()> next) {
  auto& st = self->state;
  auto actor = st.members.nodes[node];
  st.members.nodes[node] = nullptr;
  st.members.node_state[node] = "left";
  if (actor) self->demonitor(actor.address());
  const double seconds = seconds_between(t0, clock_type::now());
  const auto& c = st.in->cluster;
  char timing[64];
  std::snprintf(timing, sizeof timing, "%.2f s", seconds);
  log_info("fusion-train", node_label(st, node) + " drained at step " + std::to_string(st.train.step) + " in " + timing +
                               ": its ops now run on " + names_of(st, usable_nodes(st)) + "; it leaves the run");
  json rec = {{"type", "leave"},     {"time", metrics_time()}, {"step", st.train.step}, {"node", c.nodes[node].name},
              {"site", c.nodes[node].site}, {"seconds", seconds},    {"nodes", names_of(st, usable_nodes(st))}};
  if (!moved.empty()) rec["migration"] = json::parse(moved, nullptr, false);
  write_record(self, rec);
  auto answer = rec;
  answer.erase("type");
  answer["state"] = "left";
  if (!actor) {
    rp.deliver(answer.dump());
    return next();
  }
  self->request(actor, leave_timeout, shutdown_atom::value)
      .then([=](bool) mutable { rp.deliver(answer.dump()); },
            [=](caf::error& e) mutable {
              auto out = answer;
              out["note"] = "the node did not confirm that it left (" + describe(e) + ")";
              rp.deliver(out.dump());
            });
  next();
}

void run_drain(coord_ptr self, size_t node, caf::response_promise rp, std::function<void()> next) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  const auto t0 = clock_type::now();
  auto restore = [self, node] {
    auto& s = self->state;
    if (s.members.nodes[node] && s.members.node_state[node] == "draining") s.members.node_state[node] = "joined";
  };
  if (!st.members.nodes[node] || st.members.node_state[node] != "draining") {
    rp.deliver(bad("node '" + c.nodes[node].name + "' is " + st.members.node_state[node] + " now: nothing to drain"));
    return next();
  }
  if (!holds_ops(st, node)) return let_leave(self, node, {}, t0, rp, next);
  caf::error err;
  auto where = placement_without(self, node, err);
  if (!where) {
    restore();
    rp.deliver(err);
    return next();
  }
  migrate(self, std::move(*where), "admin: drain node '" + c.nodes[node].name + "'",
          [=](caf::error e, std::string summary) mutable {
            if (e) {
              restore();
              rp.deliver(e);
              return next();
            }
            if (holds_ops(self->state, node)) {
              restore();
              rp.deliver(bad("node '" + self->state.in->cluster.nodes[node].name +
                             "' still holds ops after the migration; it stays in the run"));
              return next();
            }
            let_leave(self, node, std::move(summary), t0, rp, next);
          });
}

}  // namespace

caf::result<std::string> command_drain(coord_ptr self, const std::vector<std::string>& args) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  if (args.size() != 1) return bad("usage: drain NODE");
  if (c.nodes.empty()) return bad("this run has no cluster: there is no node to drain");
  std::vector<std::string> names;
  for (auto& n : c.nodes) names.push_back(n.name);
  const int found = c.find_node(args[0]);
  if (found < 0) {
    std::string all;
    for (auto& n : names) all += (all.empty() ? "" : ", ") + n;
    return bad("unknown node '" + args[0] + "'" + did_you_mean(args[0], names) + "; nodes: " + all);
  }
  const auto node = static_cast<size_t>(found);
  if (!wired_phase(st))
    return make_error(fusion_errc::wrong_phase, "cannot drain a node while the run is " + std::string(to_string(st.phase)));
  if (st.members.nodes[node] && st.members.nodes[node]->node() == self->node())
    return bad("node '" + args[0] + "' runs in the coordinator's own process: it cannot leave while the run goes on");
  if (!usable_node(st, node))
    return bad("node '" + args[0] + "' is " + st.members.node_state[node] + ": only a joined node can be drained");
  auto others = usable_nodes(st);
  others[node] = false;
  if (std::find(others.begin(), others.end(), true) == others.end())
    return bad("node '" + args[0] + "' is the last node of the run: no other node could take its ops (stop the run "
               "instead)");
  st.members.node_state[node] = "draining";
  auto rp = self->make_response_promise();
  run_or_queue(self, rp, [=](caf::response_promise p, std::function<void()> next) { run_drain(self, node, p, next); });
  return rp;
}

}  // namespace fusion
