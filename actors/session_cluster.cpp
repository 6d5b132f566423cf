// Cluster mode of the coordinator: fusion-node processes join, the graph is placed on them,
// op actors are spawned there and wired through edge senders, and their traffic is polled after
// every step (docs/distributed.md).
#include <caf/io/all.hpp>

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "actors/edge_actor.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_device.hpp"
#include "actors/session_impl.hpp"
#include "core/wire.hpp"

namespace fusion {

std::string session::impl::node_label(size_t i) const {
  return "node '" + cluster.nodes[i].name + "' (site " + cluster.nodes[i].site + ")";
}

void session::impl::on_down(const caf::down_msg& dm) {
  for (size_t i = 0; i < nodes.list.size(); ++i) {
    if (!nodes.list[i] || nodes.list[i].address() != dm.source) continue;
    nodes.list[i] = nullptr;  // nothing to shut down there any more
    if (failure.empty())
      failure = node_label(i) + " is gone (" + caf::to_string(dm.reason) +
                "): it was killed, crashed or stopped answering heartbeats for " +
                std::to_string(cfg.peer_timeout_ms) + " ms";
  }
}

// Publishes the coordinator and waits until every node of the cluster file has said hello.
void session::impl::join_nodes() {
  std::string host = cluster.coordinator_host;
  uint16_t port = static_cast<uint16_t>(cluster.coordinator_port);
  if (!cfg.listen.empty()) std::tie(host, port) = parse_host_port(cfg.listen, "cluster.listen");
  auto me = caf::actor_cast<caf::actor>(*self);
  auto bound = sys->middleman().publish(me, port, host.c_str(), true);
  if (!bound)
    throw std::runtime_error("cannot listen for nodes on " + host + ":" + std::to_string(port) + ": " +
                             sys->render(bound.error()));
  nodes.self = self.get();
  nodes.list.assign(cluster.nodes.size(), nullptr);
  nodes.hellos.assign(cluster.nodes.size(), {});
  if (cfg.progress)
    std::fprintf(stderr, "fusion-train: waiting for %zu node(s) of %s on %s:%u\n", cluster.nodes.size(),
                 cluster.file.c_str(), host.c_str(), static_cast<unsigned>(*bound));
  if (cfg.on_listening) cfg.on_listening(*bound);
  size_t joined = 0;
  auto deadline = clock_type::now() + std::chrono::duration<double>(cfg.join_timeout_s);
  while (joined < cluster.nodes.size() && failure.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) break;
    (*self)->receive(
        [&](hello_atom, node_hello& h, caf::actor& node) -> caf::message {
          std::string why;
          int idx = cluster.find_node(h.name);
          if (h.version != wire_protocol_version)
            why = "node '" + h.name + "' speaks protocol version " + std::to_string(h.version) +
                  ", this coordinator speaks " + std::to_string(wire_protocol_version) + ": run the same build";
          else if (idx < 0)
            why = "node '" + h.name + "' is not in cluster file " + cluster.file;
          else if (nodes.list[idx])
            why = "node '" + h.name + "' has already joined";
          else if (!same_device(h.device.substr(0, h.device.find(' ')), cluster.nodes[idx].device))
            why = "node '" + h.name + "' drives " + h.device + " but " + cluster.file + " gives it device " +
                  cluster.nodes[idx].device + ": set [node] device in its config to match";
          if (!why.empty()) {
            std::fprintf(stderr, "fusion-train: refused a node: %s\n", why.c_str());
            return caf::make_message(welcome_atom::value, int32_t{-1}, wire_protocol_version, why);
          }
          nodes.list[idx] = node;
          nodes.hellos[idx] = h;
          (*self)->monitor(node);
          ++joined;
          if (cfg.progress)
            std::fprintf(stderr, "fusion-train: %s joined: %s, %.0f GFLOP/s, %.1f GiB, pid %d (%zu/%zu)\n",
                         node_label(idx).c_str(), h.device.c_str(), h.gflops,
                         static_cast<double>(h.memory_bytes) / (1 << 30), h.pid, joined, cluster.nodes.size());
          return caf::make_message(welcome_atom::value, static_cast<int32_t>(idx), wire_protocol_version,
                                   std::string{});
        },
        [&](caf::down_msg& dm) { on_down(dm); }, caf::after(left) >> [] {});
  }
  if (!failure.empty()) throw std::runtime_error(failure);
  if (joined < cluster.nodes.size()) {
    std::string missing;
    for (size_t i = 0; i < cluster.nodes.size(); ++i)
      if (!nodes.list[i]) missing += (missing.empty() ? "" : ", ") + cluster.nodes[i].name;
    throw std::runtime_error("node(s) " + missing + " of " + cluster.file + " did not join within " +
                             std::to_string(static_cast<int>(cfg.join_timeout_s)) +
                             " s (cluster.join-timeout); start them with fusion-node --config configs/nodes/...");
  }
}

// Spawns every op actor on its node and wires the graph. An edge between two nodes becomes two
// edge senders: the activation one on the producer's node, the gradient one on the consumer's.
// Each op actor computes on its node's device (cluster file), except those runtime.cpu-ops keeps
// on the CPU.
void session::impl::spawn_on_nodes(actor_run_params run) {
  const auto& where = place.node_of_op;
  const auto cpu_ops = split_patterns(cfg.cpu_ops);
  for (auto& n : model.nodes) {
    run.device = device_for_op(cluster.nodes[where[n.id]].device, cpu_ops, n.name);
    actors.list.push_back(ask_node<caf::actor>(where[n.id], "spawning op actor", spawn_atom::value,
                                               make_node_spec(model, n.id), run));
  }
  edge_config ec{cfg.window, cfg.chunk_bytes};
  std::vector<std::vector<caf::actor>> consumers(model.nodes.size()), producers(model.nodes.size());
  for (auto& n : model.nodes) producers[n.id].resize(n.inputs.size());
  uint64_t next_edge = 1;
  for (auto& n : model.nodes) {
    for (auto& c : n.consumers) {
      int a = where[n.id], b = where[c.node];
      if (a == b) {
        consumers[n.id].push_back(actors[c.node]);
        producers[c.node][c.slot] = actors[n.id];
        continue;
      }
      auto link = [&](int from, int to, int target, bool forward) {
        uint64_t id = next_edge++;
        const auto& peer = nodes.hellos[to];
        bool tcp = cfg.transport == "tcp";
        auto sender = ask_node<caf::actor>(from, "creating an edge sender", edge_atom::value, id, nodes.list[to], ec,
                                           tcp ? peer.host : std::string{}, tcp ? peer.data_port : uint16_t{0});
        ask_node<bool>(to, "routing an edge", route_atom::value, id, actors[target], sender);
        edges[id] = edge_info{n.id, c.node, forward, from, to};
        return sender;
      };
      consumers[n.id].push_back(link(a, b, c.node, true));
      producers[c.node][c.slot] = link(b, a, n.id, false);
    }
  }
  // Every actor must know its neighbours before any data flows: tensors on the TCP data channel
  // can overtake a connect_atom still travelling over CAF, and an actor that computes before it
  // is connected would send its output to nobody.
  gather<bool>(model.nodes.size(), "connecting the op actors", [&] {
    for (auto& n : model.nodes)
      (*self)->send(actors[n.id], connect_atom::value, std::move(consumers[n.id]), std::move(producers[n.id]),
                    caf::actor_cast<caf::actor>(*self));
  });
  if (cfg.progress)
    std::fprintf(stderr, "fusion-train: placement (%s):\n%s", placement_policy_names()[static_cast<int>(cluster.placement.policy)].c_str(),
                 format_placement(model, cluster, place).c_str());
}

// Edge traffic of the step that just ended, from every node.
std::vector<edge_measurement> session::impl::poll_edge_traffic() {
  std::vector<edge_measurement> out;
  size_t live = 0;
  for (auto& n : nodes.list) live += n ? 1 : 0;
  auto all = gather<node_stats>(live, "reading the traffic of the nodes", [&] {
    for (auto& n : nodes.list)
      if (n) (*self)->send(n, stats_atom::value);
  });
  for (auto& st : all) {
    for (auto& e : st.edges) {
      auto it = edges.find(e.edge);
      if (it == edges.end()) continue;
      const auto& info = it->second;
      out.push_back({info.producer, info.consumer, info.forward, cluster.nodes[info.from].name,
                     cluster.nodes[info.to].name, e.bytes, e.tensors, e.seconds});
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return std::tie(a.producer, a.consumer, b.forward) < std::tie(b.producer, b.consumer, a.forward);
  });
  return out;
}

}  // namespace fusion
