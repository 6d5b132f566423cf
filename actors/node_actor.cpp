#include "actors/node_actor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "actors/data_channel.hpp"
#include "actors/edge_actor.hpp"
#include "actors/messages.hpp"
#include "actors/op_actor.hpp"
#include "actors/snapshot_holder.hpp"
#include "core/log.hpp"
#include "core/wire.hpp"
#include "net/link_probe.hpp"
#include "ops/cpu_quota.hpp"
#include "scheduler/op_timing.hpp"

namespace fusion {

namespace {

struct node_state {
  node_identity id;
  std::shared_ptr<std::atomic<int>> exit_code;
  op_reporter coordinator;                                  // failures go there
  std::vector<op_actor> hosted;                             // op actors
  std::map<uint64_t, edge_sender_actor> senders;            // edge senders by edge id
  std::vector<snapshot_holder> holders;                     // peer-held snapshots (hold_atom)
  std::shared_ptr<route_table> routes;
  std::map<std::string, std::shared_ptr<data_link>> links;  // data channels to peers, by "host:port"
  std::map<std::string, std::shared_ptr<data_link>> reversed;  // opened by peers behind firewalls, by name
  // Edges waiting for a firewalled peer to dial this node, by its name (one reverse_atom each).
  std::map<std::string, std::vector<std::function<void(result<std::shared_ptr<data_link>>)>>> dialing;
  // Peers whose data channel could not be reached although the cluster file does not say they
  // are behind a firewall: later edges to them go straight to connection reversal.
  std::set<std::string> unreachable;
  wire_assembler assembler;                                 // chunks that came over CAF
  std::map<uint64_t, edge_stat> traffic;  // since the last poll
  double cpu_at_poll = process_cpu_seconds();  // the process's CPU time at the last poll
  uint64_t rejected = 0;
  std::string last_rejection;
  bool shutting_down = false;
  static inline const char* name = "node_actor";
};

using node_ptr = node_actor::stateful_pointer<node_state>;

void stop_hosted(node_ptr self) {
  for (auto& a : self->state.hosted) self->send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& [edge, a] : self->state.senders) self->send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& a : self->state.holders) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->state.holders.clear();
  self->state.hosted.clear();
  self->state.senders.clear();
}

// A data-channel connection that never delivered a frame (a port scanner, a misdirected
// program, an attacker) is closed by the channel; the node counts and logs it, and the run goes
// on: nothing of the run was lost.
void refuse_stranger(node_ptr self, const std::string& why) {
  auto& st = self->state;
  ++st.rejected;
  st.last_rejection = why;
  log_warn("fusion-node " + st.id.name, "refused a connection to the data channel: " + why);
}

// A refused message is counted and logged, and the coordinator hears of it: a chunk missing on
// a real edge would otherwise surface only as a step timeout.
void reject(node_ptr self, const std::string& why) {
  auto& st = self->state;
  ++st.rejected;
  st.last_rejection = why;
  log_warn("fusion-node " + st.id.name, "rejected wire message: " + why);
  if (st.coordinator)
    self->send(st.coordinator, fail_atom::value,
               make_error(fusion_errc::wire_rejected, "node " + st.id.name + ": rejected wire message: " + why));
}

void receive_chunk(node_ptr self, const wire_chunk& c) {
  auto& st = self->state;
  auto accepted = accept_chunk(c.header, c.size(), *st.routes, st.assembler);
  if (!accepted) {
    // A late chunk of an edge whose route was removed (a plan given up) is dropped, as on the
    // data channel (actors/data_channel.cpp): refused, it would fail the run.
    if (late_chunk_edge(c.header, c.size(), *st.routes)) return;
    return reject(self, accepted.error());
  }
  if (c.size() > 0) std::memcpy(accepted->dst, c.data(), c.size());
  auto whole = st.assembler.end_chunk(accepted->header);
  if (!whole) reject(self, whole.error());
  finish_chunk(accepted->route, accepted->header, whole ? std::move(*whole) : std::nullopt);
}

// The data channel to node `peer` at host:port, connected on first use and shared by every edge
// to that node.
result<std::shared_ptr<data_link>> link_to(node_ptr self, const std::string& host, uint16_t port,
                                           const std::string& peer) {
  auto key = host + ":" + std::to_string(port);
  auto& links = self->state.links;
  if (auto it = links.find(key); it != links.end() && it->second) return it->second;
  auto link = connect_data_link(host, port, peer, self->state.id.tls, self);
  if (link) links[key] = *link;
  return link;
}

// The data channel to node `peer`, which accepts no inbound connection: it is asked (over CAF,
// through the coordinator) to dial this node's data channel, whose server hands the connection
// over as a link. `then` gets the link, null when neither side accepts inbound connections (the
// edge's tensors then go over CAF through the coordinator, slower: said in a warning), or why
// it failed. Edges created while the peer dials wait for the same connection.
void reversed_link_to(node_ptr self, const node_inbox& peer_inbox, const std::string& peer,
                      std::function<void(result<std::shared_ptr<data_link>>)> then) {
  auto& st = self->state;
  if (auto it = st.reversed.find(peer); it != st.reversed.end()) return then(it->second);
  if (!st.id.reverse || !st.id.reverse->accepts_inbound() || st.id.reverse->port() == 0) {
    log_warn("fusion-node " + st.id.name,
             "neither this node nor node '" + peer + "' accepts inbound connections (accept_inbound: false): "
             "tensors to '" + peer + "' go over the control channel through the coordinator, which is slower");
    st.reversed[peer] = nullptr;
    return then(std::shared_ptr<data_link>{});
  }
  auto& waiting = st.dialing[peer];
  waiting.push_back(std::move(then));
  if (waiting.size() > 1) return;  // the peer is dialing already
  auto token = st.id.reverse->expect(peer);
  auto finish = [self, peer](result<std::shared_ptr<data_link>> r) {
    auto& s = self->state;
    auto waiting = std::move(s.dialing[peer]);
    s.dialing.erase(peer);
    if (r) s.reversed[peer] = *r;
    for (auto& f : waiting) f(r);
  };
  self->request(caf::actor_cast<node_actor>(peer_inbox), std::chrono::seconds(30), reverse_atom::value, st.id.name,
                st.id.reverse->host(), st.id.reverse->port(), token)
      .then(
          [self, peer, finish](bool) {
            // The peer answers once the sender's ack reached it; the server hands the
            // connection over just after sending that ack.
            auto link = self->state.id.reverse->take(peer, std::chrono::seconds(5));
            if (!link)
              return finish(fail("node '" + peer + "' said it dialed, but no connection from it arrived"));
            finish(link);
          },
          [self, peer, finish](caf::error& e) {
            self->state.id.reverse->take(peer);
            finish(fail(describe(e)));
          });
}

// An edge's sender once its link (or none: CAF) is known; replaces an earlier sender of `edge`.
edge_sender_actor make_sender(node_ptr self, uint64_t edge, const node_inbox& peer, const edge_config& cfg,
                              std::shared_ptr<data_link> link, const codec_settings& codec) {
  auto& slot = self->state.senders[edge];
  if (slot) self->send_exit(slot, caf::exit_reason::user_shutdown);  // replaced
  slot = spawn_edge_sender(self->system(), edge, peer, cfg, self, std::move(link), codec);
  return slot;
}

// Profiling and link probes block for up to seconds: each runs in a detached actor (a thread of
// its own) that answers the coordinator's request itself and quits, so the node actor keeps
// serving heartbeats, stats polls and shutdown meanwhile.
caf::behavior measure_worker(caf::event_based_actor* self, node_identity id) {
  const std::string me = "fusion-node " + id.name;
  return {
      [=](profile_atom, std::vector<op_signature>& ops) -> caf::result<device_timing> {
        self->quit();
        try {
          auto t = time_ops(id.device, ops);
          char line[200];
          // The quota decides how ops are timed (CPU time under one below a core): say which.
          char share[64];
          if (t.quota.binds())
            std::snprintf(share, sizeof share, "CPU quota %.2f core per %.0f ms, ops timed by CPU time",
                          t.quota.cores, t.quota.period_s * 1e3);
          else
            std::snprintf(share, sizeof share, "CPU share %.2f", t.cpu_share);
          std::snprintf(line, sizeof line, "timed %zu ops on %s in %.2f s (%s)", t.ops.size(), t.device.c_str(),
                        t.seconds, share);
          log_info(me, line);
          return t;
        } catch (const std::exception& e) {
          return make_error(fusion_errc::op_failed, "node " + id.name + ": " + e.what());
        }
      },
      [=](reverse_atom, std::string& sender, std::string& host, uint16_t port,
          std::string& token) -> caf::result<bool> {
        self->quit();
        if (!id.reverse)
          return make_error(fusion_errc::connect_failed, "node " + id.name + " has no data channel to dial from");
        auto st = id.reverse->dial(id.name, sender, host, port, token, id.tls);
        if (!st) return make_error(fusion_errc::connect_failed, st.error());
        log_info(me, "opened the data channel connection from node '" + sender + "' (" + host + ":" +
                         std::to_string(port) + ") from this end: connection reversal, since '" + sender +
                         "' cannot connect to this node");
        return true;
      },
      [=](probe_atom, std::string& peer, std::string& host, uint16_t port, uint32_t warmup_ms,
          uint32_t window_ms) -> caf::result<double, double> {
        self->quit();
        net::probe_options o;
        o.warmup = std::chrono::milliseconds(warmup_ms);
        o.duration = std::chrono::milliseconds(window_ms);
        // Small frames: a slow link still gets acks (rate samples) within a short window.
        o.frame_bytes = size_t{64} << 10;
        o.connect_timeout = std::chrono::milliseconds(3000);
        o.ack_timeout = std::chrono::milliseconds(5000);
        o.tls = id.tls;
        o.peer = {security::role::node, peer};
        auto r = net::probe_link(host, port, o);
        if (!r)
          return make_error(fusion_errc::connect_failed,
                            "link probe from node '" + id.name + "' to node '" + peer + "' failed: " + r.error());
        char line[200];
        std::snprintf(line, sizeof line, "link to node '%s' (%s:%u): %.1f Mbit/s, round trip %.3f ms", peer.c_str(),
                      host.c_str(), static_cast<unsigned>(port), r->mbit_per_s, r->rtt_ms);
        log_info(me, line);
        return {r->mbit_per_s, r->rtt_ms / 1e3};
      },
  };
}

node_actor::behavior_type node_actor_fn(node_ptr self, node_identity id, std::shared_ptr<std::atomic<int>> exit_code,
                                        std::shared_ptr<route_table> routes) {
  self->state.id = std::move(id);
  self->state.routes = std::move(routes);
  self->state.exit_code = std::move(exit_code);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.coordinator.address()) return;
    if (!st.shutting_down) {
      log_error("fusion-node " + st.id.name, "lost the coordinator (" + describe(dm.reason) + "), stopping");
      st.exit_code->store(1);
    }
    stop_hosted(self);
    self->quit();
  });
  return {
      // Sent by fusion-node before its hello (apps/fusion_node.cpp says why).
      [=](coordinator_atom, op_reporter& coordinator) {
        auto& st = self->state;
        if (st.coordinator) self->demonitor(st.coordinator.address());
        st.coordinator = coordinator;
        self->monitor(coordinator);
        return true;
      },
      [=](spawn_atom, node_spec& spec, actor_run_params& run) -> caf::result<op_actor> {
        try {
          auto a = spawn_op_actor(self->system(), std::move(spec), std::move(run));
          self->state.hosted.push_back(a);
          return a;
        } catch (const std::exception& e) {
          return make_error(fusion_errc::spawn_failed, "node " + self->state.id.name + ": " + e.what());
        }
      },
      [=](hold_atom, std::string& op, uint32_t tensors, uint32_t keep, edge_sender_actor& forward,
          snapshot_holder& buddy) {
        // Kept for the shutdown; one the coordinator stopped (stop_atom) stays listed, harmlessly.
        auto& holders = self->state.holders;
        holders.push_back(spawn_snapshot_holder(self->system(), "fusion-node " + self->state.id.name, std::move(op),
                                                tensors, keep, std::move(forward), std::move(buddy)));
        return holders.back();
      },
      // Migration: an op actor that moved away (or a new one whose move was abandoned).
      [=](retire_atom, op_actor& op) {
        auto& hosted = self->state.hosted;
        auto it = std::find(hosted.begin(), hosted.end(), op);
        if (it == hosted.end()) return false;
        self->send_exit(op, caf::exit_reason::user_shutdown);
        hosted.erase(it);
        return true;
      },
      [=](edge_atom, uint64_t edge, node_inbox& peer, edge_config& cfg, std::string& host, uint16_t port,
          bool receiver_dials, std::string& peer_node, codec_settings& codec) -> caf::result<edge_sender_actor> {
        auto via_reversal = [=]() -> caf::result<edge_sender_actor> {
          auto rp = self->make_response_promise<edge_sender_actor>();
          reversed_link_to(self, peer, peer_node, [=](result<std::shared_ptr<data_link>> link) mutable {
            if (link)
              rp.deliver(make_sender(self, edge, peer, cfg, *link, codec));
            else
              rp.deliver(make_error(fusion_errc::connect_failed, "node " + self->state.id.name + ": " + link.error()));
          });
          return rp;
        };
        if (receiver_dials) return via_reversal();
        std::shared_ptr<data_link> link;
        if (port != 0) {
          auto& st = self->state;
          if (st.unreachable.count(peer_node)) return via_reversal();
          auto connected = link_to(self, host, port, peer_node);
          if (!connected && data_link_unreachable(connected.error())) {
            // A firewall nobody declared (accept_inbound: false would have said so): the peer
            // may still dial this node, as for a declared one.
            log_warn("fusion-node " + st.id.name, connected.error() + ": node '" + peer_node +
                                                      "' takes no inbound connection (a firewall?); asking it "
                                                      "to dial this node instead (connection reversal)");
            st.unreachable.insert(peer_node);
            return via_reversal();
          }
          if (!connected)
            return make_error(fusion_errc::connect_failed, "node " + st.id.name + ": " + connected.error());
          link = std::move(*connected);
        }
        return make_sender(self, edge, peer, cfg, std::move(link), codec);
      },
      [=](reverse_atom, std::string& sender, std::string& host, uint16_t port,
          std::string& token) -> caf::result<bool> {
        // Dialing blocks for up to seconds: in a worker, as probes do.
        auto rp = self->make_response_promise<bool>();
        rp.delegate(self->spawn<caf::detached>(measure_worker, self->state.id), reverse_atom::value, std::move(sender),
                    std::move(host), port, std::move(token));
        return rp;
      },
      [=](route_atom, uint64_t edge, tensor_sink& target, edge_sender_actor& sender) {
        self->state.routes->set(edge, edge_route{target, sender});
        return true;
      },
      // Re-wiring: the coordinator removes the edges of the old wiring once the new one is in place.
      [=](unroute_atom, uint64_t edge) {
        self->state.routes->erase(edge);
        // Over CAF its tensors arrive in this actor only, so none is being written: what is
        // half received would otherwise stay for the node's life. (A data channel connection's
        // go when it closes: a reader may be writing into them.)
        self->state.assembler.drop_edge(edge);
        return true;
      },
      // A lost peer (a killed process, or a cut link: then nothing tells this node) is never sent
      // to again: its connections are aborted now and forgotten, so a peer that comes back (at
      // the same host and data port, node.data-port) gets fresh ones, and no reader or writer
      // thread waits on a connection whose far end is gone.
      [=](forget_peer_atom, std::string& peer, std::string& host, uint16_t port) {
        auto& st = self->state;
        auto drop = [&](std::shared_ptr<data_link>& link) {
          if (!link) return;
          link->abort();
          log_info("fusion-node " + st.id.name, "closed the data channel connection to node '" + peer +
                                                    "' (" + host + ":" + std::to_string(port) + "): it was lost");
        };
        if (auto it = st.links.find(host + ":" + std::to_string(port)); it != st.links.end()) {
          drop(it->second);
          st.links.erase(it);
        }
        if (auto it = st.reversed.find(peer); it != st.reversed.end()) {
          drop(it->second);
          st.reversed.erase(it);
        }
        // A node that returns may come back reachable (another host, its firewall opened): it
        // is dialed first again, as any node is.
        st.unreachable.erase(peer);
        return true;
      },
      [=](drop_atom, uint64_t edge) {
        auto& st = self->state;
        if (auto it = st.senders.find(edge); it != st.senders.end()) {
          self->send_exit(it->second, caf::exit_reason::user_shutdown);
          st.senders.erase(it);
          st.traffic.erase(edge);
        }
        return true;
      },
      [=](profile_atom, std::vector<op_signature>& ops) -> caf::result<device_timing> {
        auto rp = self->make_response_promise<device_timing>();
        rp.delegate(self->spawn<caf::detached>(measure_worker, self->state.id), profile_atom::value, std::move(ops));
        return rp;
      },
      [=](probe_atom, std::string& peer, std::string& host, uint16_t port, uint32_t warmup_ms,
          uint32_t window_ms) -> caf::result<double, double> {
        auto rp = self->make_response_promise<double, double>();
        rp.delegate(self->spawn<caf::detached>(measure_worker, self->state.id), probe_atom::value, std::move(peer),
                    std::move(host), port, warmup_ms, window_ms);
        return rp;
      },
      [=](wire_atom, const wire_chunk& c) { receive_chunk(self, c); },
      [=](wire_atom, const std::string& rejection, bool stray) {
        if (stray)
          refuse_stranger(self, rejection);
        else
          reject(self, rejection);
      },
      [=](fail_atom, caf::error& e) {
        auto& st = self->state;
        if (st.coordinator)
          self->send(st.coordinator, fail_atom::value,
                     make_error(code_of(e) == fusion_errc::none ? fusion_errc::op_failed : code_of(e),
                                "node " + st.id.name + ": " + describe(e)));
      },
      [=](stats_atom, const edge_stat& s) {
        auto& t = self->state.traffic[s.edge];
        t.edge = s.edge;
        t.bytes += s.bytes;
        t.dense_bytes += s.dense_bytes;
        t.tensors += s.tensors;
        t.seconds += s.seconds;
        t.encode_s += s.encode_s;
        t.keep_ratio = s.keep_ratio;
        t.idle_starts += s.idle_starts;
      },
      [=](stats_atom) -> node_stats {
        auto& st = self->state;
        node_stats out;
        for (auto& [edge, t] : st.traffic) out.edges.push_back(t);
        st.traffic.clear();
        const double cpu = process_cpu_seconds();
        out.cpu_s = cpu - std::exchange(st.cpu_at_poll, cpu);
        out.rejected = st.rejected;
        out.last_rejection = st.last_rejection;
        const cpu_quota q = process_cpu_quota();  // re-read at most once a second
        out.quota_cores = q.cores;
        out.quota_period_s = q.period_s;
        return out;
      },
      [=](shutdown_atom) {
        auto& st = self->state;
        st.shutting_down = true;
        st.exit_code->store(0);
        stop_hosted(self);
        st.links.clear();
        st.reversed.clear();
        st.unreachable.clear();
        self->quit();
        return true;
      },
  };
}

}  // namespace

void set_liveness(caf::actor_system_config& cfg, int64_t heartbeat_ms, int64_t timeout_ms) {
  if (heartbeat_ms <= 0 || timeout_ms <= heartbeat_ms)
    throw std::runtime_error("heartbeat-ms (" + std::to_string(heartbeat_ms) + ") must be > 0 and below " +
                             "peer-timeout-ms (" + std::to_string(timeout_ms) + ")");
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

void set_scheduler_policy(caf::actor_system_config& cfg, const std::string& policy) {
  if (policy != "stealing" && policy != "sharing")
    throw std::runtime_error("runtime.scheduler must be \"stealing\" or \"sharing\", got \"" + policy + "\"");
  if (policy == "sharing")
    cfg.set("scheduler.policy", caf::atom("sharing"));
  else
    cfg.set("scheduler.policy", caf::atom("stealing"));
}

node_actor spawn_node_actor(caf::actor_system& sys, node_identity id, std::shared_ptr<std::atomic<int>> exit_code,
                            std::shared_ptr<route_table> routes) {
  return sys.spawn(node_actor_fn, std::move(id), std::move(exit_code), std::move(routes));
}

}  // namespace fusion
