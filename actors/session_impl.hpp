// The coordinator's state (session::impl), shared by actors/trainer.cpp (one-process runs,
// training steps, evaluation, sampling, checkpoints) and actors/session_cluster.cpp (nodes
// joining, placement, spawning and wiring on nodes, traffic polls). Internal to actors/.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/op_actor.hpp"
#include "actors/trainer.hpp"
#include "core/cluster.hpp"
#include "core/data.hpp"
#include "core/graph.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

using clock_type = std::chrono::steady_clock;

inline std::string describe(const char* what) { return what; }
template <class F>
std::string describe(const F& what) {
  return what();
}

// Owns the op actors and stops them when destroyed, also when the session constructor throws
// halfway: otherwise ~actor_system would wait forever for actors nobody stops.
struct actor_group {
  std::vector<caf::actor> list;
  ~actor_group() {
    for (auto& a : list) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  caf::actor& operator[](size_t i) { return list[i]; }
  size_t size() const { return list.size(); }
};

/// What the coordinator knows about one cross-process edge.
struct edge_info {
  int producer = -1, consumer = -1;
  bool forward = true;
  int from = -1, to = -1;  // cluster node indices
};

// The fusion-node processes of a run. Ends them with shutdown_atom when destroyed, so nodes exit
// cleanly also when the session constructor throws after they joined.
struct node_group {
  caf::scoped_actor* self = nullptr;
  std::vector<caf::actor> list;        // by cluster node index; empty handle: not joined
  std::vector<node_hello> hellos;
  ~node_group() {
    if (!self) return;
    for (auto& n : list) {
      if (!n) continue;
      (*self)->request(n, std::chrono::seconds(5), shutdown_atom::value).receive([](bool) {}, [](caf::error&) {});
    }
  }
};

struct session::impl {
  train_config cfg;
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  graph model;
  char_tokenizer tokenizer;
  std::unique_ptr<text_dataset> data;
  node_group nodes;                    // cluster mode only; destroyed after the actors are stopped
  actor_group actors;                  // by node id; declared after sys, so destroyed first
  cluster_spec cluster;                // cluster mode only
  fusion::placement place;             // cluster mode only
  std::map<uint64_t, edge_info> edges; // cluster mode only: by edge id
  std::string last_checkpoint;         // "FILE at step N" once one was written
  std::vector<int> compute_nodes;      // non-input node ids (they run backward and step)
  int64_t step = 0;
  int64_t micro_rows = 0;              // rows per micro-batch
  std::string failure;                 // first failure reported by an actor
  std::ofstream metrics;

  explicit impl(train_config c);

  // Fails fast, before any data is read, when runtime.device names a GPU this process cannot
  // use; a cluster run takes its devices from the cluster file.
  void check_devices();

  // ---- cluster mode: nodes join, op actors are spawned on them and wired through edges ----

  std::string node_label(size_t i) const;

  void on_down(const caf::down_msg& dm);

  // Publishes the coordinator and waits until every node of the cluster file has said hello.
  void join_nodes();

  template <class T, class... Ts>
  T ask_node(size_t node, const char* what, Ts&&... xs) {
    T out{};
    std::string err;
    (*self)->request(nodes.list.at(node), std::chrono::seconds(60), std::forward<Ts>(xs)...)
        .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { err = sys->render(e); });
    if (!err.empty()) throw std::runtime_error(std::string(what) + " on " + node_label(node) + ": " + err);
    return out;
  }

  // Spawns every op actor on its node and wires the graph. An edge between two nodes becomes two
  // edge senders: the activation one on the producer's node, the gradient one on the consumer's.
  // Each op actor computes on its node's device (cluster file), except those runtime.cpu-ops keeps
  // on the CPU.
  void spawn_on_nodes(actor_run_params run);

  // Edge traffic of the step that just ended, from every node.
  std::vector<edge_measurement> poll_edge_traffic();

  // Runs `send_all` (which sends one request-like message to each of `n` actors) and collects
  // the n replies of type T, in arrival order. Unlike request().receive(), the wait also sees a
  // node going down or an actor failing, so a dead node ends it within the peer timeout.
  template <class T, class SendAll>
  std::vector<T> gather(size_t n, const std::string& what, SendAll send_all) {
    send_all();
    std::vector<T> out;
    std::string err;
    wait_until([&] { return out.size() == n || !err.empty(); }, what.c_str(),
               [&](T& v) { out.push_back(std::move(v)); }, [&](caf::error& e) { err = sys->render(e); });
    if (!err.empty()) throw std::runtime_error(what + ": " + err);
    return out;
  }

  // Splits a (rows, T) batch into micro-batches and sends tokens and targets to the inputs.
  void feed(uint64_t s, uint32_t first_mb, pass_mode mode, const std::vector<int32_t>& x,
            const std::vector<int32_t>& y, int64_t rows, int64_t per_mb, int64_t T);

  // Waits for messages until `done()`; converts actor failures and timeouts into exceptions.
  template <class Done, class What, class... Handlers>
  void wait_until(Done done, What what, Handlers... handlers) {
    auto deadline = clock_type::now() + std::chrono::duration<double>(cfg.step_timeout_s);
    while (!done() && failure.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      if (left.count() <= 0) break;
      (*self)->receive(
          handlers...,
          [&](fail_atom, std::string& node, std::string& msg) {
            if (failure.empty()) failure = (node.rfind("node ", 0) == 0 ? node : "op actor '" + node + "'") +
                                           " failed: " + msg;
          },
          [&](caf::down_msg& dm) { on_down(dm); },
          caf::after(left) >> [] {});
    }
    if (!failure.empty()) {
      if (!last_checkpoint.empty()) failure += " (last checkpoint: " + last_checkpoint + ")";
      throw std::runtime_error(failure);
    }
    if (!done())
      throw std::runtime_error(std::string("timed out after ") + std::to_string(cfg.step_timeout_s) +
                               " s waiting for " + describe(what) + " (runtime.step-timeout)");
  }

  step_record train_step();

  double evaluate();

  std::string sample(int count, const std::string& prompt, double temperature, uint64_t seed);

  void save(const std::string& path);

  void load(const std::string& path);

  void log_metrics(const std::string& json);
};

}  // namespace fusion
