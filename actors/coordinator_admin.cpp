// The coordinator's faces to the outside: the answers to admin queries (status, nodes,
// placement, ops, links) as JSON, pause and resume, and the typed admin actor published on
// admin.port that forwards a remote shell's requests to the coordinator.
#include <caf/io/all.hpp>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>

#include "actors/admin_protocol.hpp"
#include "actors/coordinator_state.hpp"
#include "actors/secure_link.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

namespace {

bool cluster_mode(const coordinator_state& st) { return !st.in->cluster.nodes.empty(); }

// ---- the admin actor ---------------------------------------------------------------------------

// Forwards to the coordinator: the admin actor is the typed face published on admin.port, so a
// remote shell can only send what admin_actor declares.
// With credentials, only shells that logged in with an admin certificate may ask anything: the
// admin actor remembers the process (CAF node) that logged in, whichever of its actors asks.
struct admin_state {
  std::shared_ptr<const security::credentials> creds;
  security::challenge_book challenges;
  std::vector<caf::node_id> admitted;
  bool admitted_sender(caf::local_actor* self) const {
    if (!creds) return true;
    auto sender = self->current_sender();
    return sender && std::find(admitted.begin(), admitted.end(), sender->node()) != admitted.end();
  }
};

caf::error not_logged_in() {
  return make_error(fusion_errc::refused,
                    "this admin shell has not logged in with the admin certificate (admin.pem; security.certs)");
}

admin_actor::behavior_type admin_fn(admin_actor::pointer self, coordinator_session coordinator,
                                    std::shared_ptr<admin_state> st) {
  return {
      [=](query_atom, std::string& topic) -> caf::result<std::string> {
        if (!st->admitted_sender(self)) return not_logged_in();
        auto rp = self->make_response_promise<std::string>();
        self->request(coordinator, std::chrono::seconds(10), query_atom::value, std::move(topic))
            .then([=](std::string& s) mutable { rp.deliver(std::move(s)); },
                  [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](command_atom, std::string& verb, std::vector<std::string>& args) -> caf::result<std::string> {
        if (!st->admitted_sender(self)) return not_logged_in();
        auto rp = self->make_response_promise<std::string>();
        // pause answers when the step in flight has finished, which may take a step's time.
        self->request(coordinator, std::chrono::minutes(10), command_atom::value, std::move(verb), std::move(args))
            .then([=](std::string& s) mutable { rp.deliver(std::move(s)); },
                  [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](challenge_atom, std::string& nonce) -> caf::result<std::string, security::proof> {
        if (!st->creds)
          return make_error(fusion_errc::refused, "this coordinator runs with security.mode=off (plaintext)");
        auto [mine, proof] = answer_challenge(*st->creds, st->challenges, nonce);
        return {std::move(mine), std::move(proof)};
      },
      [=](login_atom, security::proof& p) -> caf::result<std::string> {
        if (!st->creds) return std::string("plaintext");
        auto who = st->challenges.redeem(p.challenge)
                       ? security::check_proof(*st->creds, p, security::role::admin, {})
                       : fusion::fail("it answered no challenge of this coordinator (stale or replayed)");
        if (!who) {
          std::fprintf(stderr, "fusion-train: refused an admin shell: %s\n", who.error().c_str());
          return make_error(fusion_errc::refused, "the coordinator refused this admin shell: " + who.error());
        }
        // A handful of shells at most; forget the oldest rather than grow.
        if (st->admitted.size() >= 64) st->admitted.erase(st->admitted.begin());
        if (auto sender = self->current_sender()) st->admitted.push_back(sender->node());
        std::fprintf(stderr, "fusion-train: admin shell '%s' logged in\n", who->name.c_str());
        return who->name;
      },
  };
}

}  // namespace

void publish_admin(coord_ptr self) {
  auto& st = self->state;
  if (st.in->cfg.admin_port == 0 && !st.in->cfg.on_admin_listening) return;
  auto admin_st = std::make_shared<admin_state>();
  admin_st->creds = st.in->cfg.credentials;
  auto admin = self->system().spawn(admin_fn, caf::actor_cast<coordinator_session>(self), admin_st);
  st.admin = caf::actor_cast<caf::actor>(admin);
  auto bound = publish_actor(admin, st.in->cfg.admin_port, st.in->cfg.admin_host, admin_st->creds != nullptr);
  if (!bound)
    return fail(self, make_error(fusion_errc::bad_config, "cannot open the admin shell on " + st.in->cfg.admin_host +
                                                              ":" + std::to_string(st.in->cfg.admin_port) +
                                                              " (admin.port): " + describe(bound.error())));
  std::fprintf(stderr, "fusion-train: admin shell listening on %s:%u\n", st.in->cfg.admin_host.c_str(),
               static_cast<unsigned>(*bound));
  if (st.in->cfg.on_admin_listening) st.in->cfg.on_admin_listening(*bound);
}

// pause: the step in flight finishes and the next one is held; answered once paused.
void request_pause(coord_ptr self, caf::response_promise rp) {
  auto& st = self->state;
  if (st.phase == run_phase::paused) return void(rp.deliver(status_json(self)));
  if (st.phase != run_phase::training && st.phase != run_phase::ready)
    return void(rp.deliver(make_error(fusion_errc::wrong_phase, std::string("cannot pause while ") + to_string(st.phase))));
  if (st.phase == run_phase::ready) {
    enter(self, run_phase::paused);
    return void(rp.deliver(status_json(self)));
  }
  st.train.pause_requested = true;
  st.pending.pause_rp = std::move(rp);
}

std::string request_resume(coord_ptr self, caf::error& err) {
  auto& st = self->state;
  if (st.phase != run_phase::paused) {
    err = make_error(fusion_errc::wrong_phase, std::string("not paused (the run is ") + to_string(st.phase) + ")");
    return {};
  }
  if (st.rebalance.migration) {
    err = make_error(fusion_errc::wrong_phase, "a migration is in flight: resume once it has finished");
    return {};
  }
  st.train.pause_requested = false;
  enter(self, st.train.training_job ? run_phase::training : run_phase::ready);
  if (st.train.training_job) self->send(self, resume_atom::value, true);  // continue the held step loop
  return status_json(self);
}

// ---- queries ---------------------------------------------------------------------------------

std::string answer_query(coord_ptr self, const std::string& topic, caf::error& err) {
  auto& st = self->state;
  const graph& g = st.in->model;
  if (topic == "status") return status_json(self);
  if (topic == "ops") return ops_json(self);
  if (topic == "links") return links_json(self);
  if (topic == "nodes") {
    json out = {{"nodes", json::array()}};
    if (!cluster_mode(st)) {
      out["nodes"].push_back({{"name", "local"}, {"site", ""}, {"device", st.in->cfg.device}, {"gflops", 0.0},
                              {"memory_bytes", 0}, {"pid", static_cast<int>(::getpid())},
                              {"state", to_string(st.phase)}});
    }
    for (size_t i = 0; i < st.in->cluster.nodes.size(); ++i) {
      const auto& n = st.in->cluster.nodes[i];
      const node_hello* h = i < st.members.hellos.size() && !st.members.hellos[i].name.empty() ? &st.members.hellos[i] : nullptr;
      out["nodes"].push_back({{"name", n.name}, {"site", n.site}, {"device", h ? h->device : n.device},
                              {"gflops", h ? h->gflops : 0.0}, {"memory_bytes", h ? h->memory_bytes : 0},
                              {"pid", h ? h->pid : 0},
                              {"state", i < st.members.node_state.size() ? st.members.node_state[i] : "waiting"}});
    }
    return out.dump();
  }
  if (topic == "placement") {
    json out = {{"policy", cluster_mode(st)
                               ? placement_policy_names()[static_cast<int>(st.in->cluster.placement.policy)]
                               : std::string("one process")},
                {"ops", json::array()},
                {"edges", json::array()}};
    auto node_name = [&](int i) { return cluster_mode(st) ? st.in->cluster.nodes[i].name : std::string("local"); };
    const placement& where = st.exec.current.where;
    if (where.node_of_op.size() == g.nodes.size())
      for (auto& n : g.nodes) {
        json op = {{"op", n.name}, {"node", node_name(where.node_of_op[n.id])}};
        // With stage replicas: every replica's node, replica 0 first.
        if (where.replicas(n.id) > 1)
          for (int r = 0; r < where.replicas(n.id); ++r) op["replicas"].push_back(node_name(where.node_of(n.id, r)));
        out["ops"].push_back(std::move(op));
      }
    for (auto& e : st.exec.current.edges) {
      json edge = {{"id", e.id}, {"dir", edge_kind_name(e.kind)}, {"producer", g.nodes[e.producer].name},
                   {"consumer", g.nodes[e.consumer].name}, {"from", node_name(e.from)},
                   {"to", node_name(e.to)}, {"bytes_per_micro_batch", e.bytes_per_micro_batch},
                   {"wire_bytes_per_micro_batch", wire_bytes_per_micro_batch(e)},
                   {"codec", codec_text(e.setting)}, {"keep_ratio", e.setting.keep_ratio}};
      if (where.replicated()) {
        edge["producer_replica"] = e.producer_replica;
        edge["consumer_replica"] = e.consumer_replica;
      }
      out["edges"].push_back(std::move(edge));
    }
    return out.dump();
  }
  err = make_error(fusion_errc::bad_command, "unknown topic '" + topic + "' (topics: status, nodes, placement, ops, links)");
  return {};
}

std::string status_json(coord_ptr self) {
  auto& st = self->state;
  const auto& cfg = st.in->cfg;
  double elapsed = st.train.training_job ? seconds_between(st.train.t0, clock_type::now()) : 0;
  double tps = elapsed > 0 ? static_cast<double>((st.train.step - st.train.first_step) * cfg.batch * st.in->model.row_items) / elapsed
                           : 0;
  double eta = tps > 0 ? static_cast<double>(cfg.steps - st.train.step) * cfg.batch * st.in->model.row_items / tps : 0;
  json out = {{"phase", to_string(st.phase)}, {"step", st.train.step}, {"steps", cfg.steps},
              {"loss", st.train.last.step > 0 ? json(st.train.last.loss) : json(nullptr)}, {"tokens_per_s", tps},
              {"eta_s", eta}, {"elapsed_s", elapsed}, {"model", st.in->model.name},
              {"cluster", st.in->cluster.file}, {"failure", st.failure},
              {"scheduler", st.rebalance.last_verdict}};
  return out.dump();
}

std::string ops_json(coord_ptr self) {
  auto& st = self->state;
  json out = {{"step", st.train.last.step}, {"ops", json::array()}};
  for (auto& m : st.train.last.ops) {
    double f = 0, b = 0;
    for (double v : m.forward_s) f += v;
    for (double v : m.backward_s) b += v;
    const placement& where = st.exec.current.where;
    int node = where.node_of_op.empty() ? 0 : where.node_of_op[m.node];
    json op = {{"op", st.in->model.nodes[m.node].name},
               {"node", st.in->cluster.nodes.empty() ? std::string("local") : st.in->cluster.nodes[node].name},
               {"fwd_ms", f * 1e3}, {"bwd_ms", b * 1e3}};
    // With stage replicas the times are summed over the replicas (each micro-batch ran on one).
    if (!st.in->cluster.nodes.empty() && !where.node_of_op.empty() && where.replicas(m.node) > 1)
      for (int r = 0; r < where.replicas(m.node); ++r)
        op["replicas"].push_back(st.in->cluster.nodes[where.node_of(m.node, r)].name);
    out["ops"].push_back(std::move(op));
  }
  return out.dump();
}

std::string links_json(coord_ptr self) {
  auto& st = self->state;
  const graph& g = st.in->model;
  json out = {{"step", st.train.last.step}, {"edges", json::array()}};
  for (auto& e : st.train.last.edges) {
    const plan_edge* p = nullptr;
    for (auto& pe : st.exec.current.edges)
      if (pe.producer == e.producer && pe.consumer == e.consumer && pe.kind != edge_kind::reduce &&
          pe.forward() == e.forward)
        p = &pe;
    out["edges"].push_back({{"id", p ? p->id : 0}, {"dir", e.forward ? "fwd" : "bwd"},
                            {"producer", g.nodes[e.producer].name}, {"consumer", g.nodes[e.consumer].name},
                            {"from", e.from_node}, {"to", e.to_node}, {"bytes", e.bytes},
                            {"dense_bytes", e.dense_bytes}, {"keep_ratio", e.keep_ratio}, {"tensors", e.tensors},
                            {"seconds", e.seconds}, {"encode_s", e.encode_s},
                            {"mbit_s", e.seconds > 0 ? static_cast<double>(e.bytes) * 8 / e.seconds / 1e6 : 0.0}});
  }
  return out.dump();
}

}  // namespace fusion
