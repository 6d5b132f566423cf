// fusion-node: one process per device of a site. It joins the coordinator (fusion-train with a
// cluster file), reports its device profile and then hosts the operator actors placed on it.
//
//   fusion-node --config configs/nodes/site-a.ini [--node.coordinator=HOST:PORT] ...
//
// It exits 0 when the coordinator ends the run, 1 when the coordinator goes away (after trying to
// rejoin it for cluster.rejoin-timeout seconds, when set) or cannot be reached, 2 for a bad configuration or when the coordinator refuses it, 130 when stopped by
// SIGINT/SIGTERM (the first stops it cleanly, a second exits at once). Its messages are log
// lines with time and level (core/log.hpp).
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <new>
#include <thread>

#include "actors/data_channel.hpp"
#include "actors/messages.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_device.hpp"
#include "actors/secure_link.hpp"
#include "apps/app_options.hpp"
#include "core/cluster.hpp"
#include "core/log.hpp"
#include "core/wire.hpp"
#include "net/tls.hpp"
#include "ops/cpu/blas.hpp"

namespace {

using namespace fusion;

struct node_app_config : table_config {
  node_identity id;
  std::string coordinator = "127.0.0.1:7700";
  std::string host = "127.0.0.1";
  uint64_t data_port = 0;
  bool accept_inbound = true;
  double join_timeout_s = 60;
  double rejoin_timeout_s = 0;
  int64_t heartbeat_ms = 250, peer_timeout_ms = 2000;
  uint64_t threads = 0, blas_threads = 1;
  std::string scheduler = "sharing";
  security::security_settings security;

  node_app_config() {
    add_rows({
        {"node", "name", "this node's name in the cluster file (required)", &id.name},
        {"node", "site", "the site it belongs to (informational; the cluster file decides)", &id.site},
        {"node", "device", "cpu, cuda or cuda:N: where this node's op actors compute (must match the cluster file)",
         &id.device},
        {"node", "coordinator", "HOST:PORT of the coordinator (fusion-train --cluster)", &coordinator},
        {"node", "host", "address other nodes reach this node on", &host},
        {"node", "data-port", "TCP port of the tensor data channel (0: any free port)", &data_port},
        {"node", "accept-inbound",
         "false: behind a firewall; listen nowhere and dial the data channels of the nodes that send to this one",
         &accept_inbound},
        {"node", "join-timeout", "seconds to keep trying to reach the coordinator", &join_timeout_s},
        {"cluster", "rejoin-timeout",
         "after losing the coordinator, seconds to keep trying to rejoin it (a coordinator restarted with --resume "
         "takes the node back; 0: exit at once)",
         &rejoin_timeout_s},
        {"cluster", "heartbeat-ms", "heartbeat interval in milliseconds (same as the coordinator's)", &heartbeat_ms},
        {"cluster", "peer-timeout-ms", "a silent coordinator is declared dead after this (milliseconds)",
         &peer_timeout_ms},
        {"runtime", "threads", "actor scheduler threads (0: one per core)", &threads, max_threads},
        {"runtime", "blas-threads", "OpenBLAS threads per op call", &blas_threads, max_threads},
        {"runtime", "scheduler", "actor scheduler: sharing (idle workers sleep) or stealing", &scheduler},
    });
    add_rows(security_rows(security));
  }
};

const char* usage =
    "usage: fusion-node --config FILE.ini [--node.name=NAME] [--node.coordinator=HOST:PORT] [--category.key=value ...]\n\n"
    "Joins a training run as one node of a cluster file: connects to the coordinator (fusion-train\n"
    "--cluster FILE), reports its device and hosts the operator actors placed on it until the run\n"
    "ends. See docs/cluster.md.\n\n"
    "examples:\n"
    "  fusion-node --config configs/nodes/site-a.ini --security.certs=runs/local-3/certs\n"
    "  fusion-node --config configs/nodes/site-b.ini --node.coordinator=10.0.0.1:7700 --security.certs=certs\n\n"
    "exit codes: 0 the run ended; 1 the coordinator could not be reached or went away; 2 a mistake in the\n"
    "command line or the config file, or the coordinator refused this node; 130 interrupted (Ctrl-C)\n";

constexpr int exit_interrupted = 130;

// What main() names when memory runs out.
std::string doing = "reading the options";

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// SIGINT and SIGTERM: the handler only notes the signal and writes its number to a pipe
// (async-signal-safe); a watcher thread reads it, logs, and asks the node actor to stop (main
// then closes the data channel, stops the actor system and exits 130). A second signal, or a stop
// that takes longer than stop_deadline_s, exits 130 at once. (sigwait would not do: threads that
// libraries start before main, such as OpenBLAS's, do not block the signals.)
std::atomic<bool> stop_signalled{false};
std::atomic<int> stop_signal_number{0};
int stop_pipe_write = -1;

extern "C" void on_stop_signal(int sig) {
  int saved = errno;
  stop_signal_number.store(sig);
  stop_signalled.store(true);
  unsigned char b = static_cast<unsigned char>(sig);
  if (stop_pipe_write >= 0 && ::write(stop_pipe_write, &b, 1) < 0) {
  }
  errno = saved;
}

// The node actor's own clean stop: its op actors and edge senders end, its data links close.
void stop_node(const node_actor& node) { caf::anon_send(node, shutdown_atom::value); }

class stop_watcher {
 public:
  static constexpr int stop_deadline_s = 5;

  /// Installs the handlers and starts the watcher thread.
  void start() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("cannot create a pipe: ") + std::strerror(errno));
    read_fd_ = fds[0];
    stop_pipe_write = fds[1];
    install_stop_signal_handler(on_stop_signal);
    std::thread([this] { watch(); }).detach();
  }
  /// Who the log lines name and which actor a stop signal ends.
  void set_target(const std::string& who, node_actor node) {
    std::lock_guard<std::mutex> lock(m_);
    who_ = who;
    node_ = std::move(node);
    if (acted_ && node_) stop_node(node_);
  }
  bool stopping() const { return stop_signalled.load(); }
  /// Waits (at most `ms` milliseconds) until the watcher has logged the signal, so that the
  /// log lines come in order.
  void await_acted(int ms) {
    for (int i = 0; i < ms / 10; ++i) {
      {
        std::lock_guard<std::mutex> lock(m_);
        if (acted_) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  int signal() const { return stop_signal_number.load(); }

 private:
  // The next signal number from the pipe; -1 when none came within `timeout_ms` (-1: forever).
  int next_signal(int timeout_ms) {
    pollfd p{read_fd_, POLLIN, 0};
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int left = timeout_ms < 0 ? -1
                                : static_cast<int>(std::max<int64_t>(
                                      0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                             until - std::chrono::steady_clock::now()).count()));
      int r = ::poll(&p, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return -1;
      unsigned char b = 0;
      ssize_t n = ::read(read_fd_, &b, 1);
      if (n == 1) return b;
      if (n < 0 && errno == EINTR) continue;
      return -1;
    }
  }

  void watch() {
    int sig = next_signal(-1);
    if (sig < 0) return;
    std::string who;
    node_actor node;
    {
      std::lock_guard<std::mutex> lock(m_);
      acted_ = true;
      who = who_;
      node = node_;
    }
    log_info(who, std::string(signal_name(sig)) + " received: stopping (send it again to exit at once)");
    if (node) stop_node(node);
    int again = next_signal(stop_deadline_s * 1000);
    if (again > 0)
      log_warn(who, std::string(signal_name(again)) + " again: exiting at once");
    else
      log_warn(who, "still not stopped after " + format_seconds(stop_deadline_s) + ": exiting at once");
    ::_exit(exit_interrupted);
  }

  int read_fd_ = -1;
  std::mutex m_;
  bool acted_ = false;
  std::string who_ = "fusion-node";
  node_actor node_;
};

// Never destroyed: the detached watcher thread may use it until the process ends.
stop_watcher& watcher = *new stop_watcher;

uint64_t physical_memory() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

int run(int argc, char** argv) {
  watcher.start();
  node_app_config cfg;
  switch (load_options("fusion-node", usage, cfg, argc, argv, {{"--name", "node.name", true}})) {
    case load_result::exit_ok: return 0;
    case load_result::exit_usage: return 2;
    case load_result::run: break;
  }
  if (cfg.id.name.empty()) {
    log_error("fusion-node", "no node name: set [node] name in the config or pass --node.name=NAME");
    return 2;
  }
  const std::string longest = " and at most " + format_number(max_wait_s) + " seconds, got ";
  if (!(cfg.join_timeout_s > 0 && cfg.join_timeout_s <= max_wait_s)) {
    log_error("fusion-node", "node.join-timeout must be more than 0" + longest + format_number(cfg.join_timeout_s));
    return 2;
  }
  if (!(cfg.rejoin_timeout_s >= 0 && cfg.rejoin_timeout_s <= max_wait_s)) {
    log_error("fusion-node", "cluster.rejoin-timeout must be 0 (off) or more" + longest + format_number(cfg.rejoin_timeout_s));
    return 2;
  }
  const std::string me = "fusion-node " + cfg.id.name;
  watcher.set_target(me, node_actor{});
  if (auto usable = device_usable(cfg.id.device); !usable) {
    log_error(me, "node.device: " + usable.error());
    return 2;
  }
  cfg.id.device = normalize_device(cfg.id.device);
  auto [coord_host, coord_port] = parse_host_port(cfg.coordinator, "node.coordinator");
  std::shared_ptr<const security::credentials> creds;
  try {
    creds = load_security(me, cfg.security, security::role::node, cfg.id.name);
  } catch (const usage_error& e) {
    log_error(me, e.what());
    return 2;
  }
  const bool tls = creds != nullptr;
  if (tls) {
    // The data channel speaks TLS 1.3 with the same files as the CAF connections.
    auto ctx = net::tls_context::load(creds->files());
    if (!ctx) {
      log_error(me, "security: " + ctx.error());
      return 2;
    }
    cfg.id.tls = std::move(*ctx);
  }
  set_liveness(cfg, cfg.heartbeat_ms, cfg.peer_timeout_ms);
  load_network(cfg, creds.get());
  add_fusion_message_types(cfg);
  int threads = cfg.threads > 0 ? static_cast<int>(cfg.threads) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cfg.set("scheduler.max-threads", static_cast<int64_t>(std::max(1, threads)));
  set_scheduler_policy(cfg, cfg.scheduler);
  cpu::set_blas_threads(std::max<int>(1, static_cast<int>(cfg.blas_threads)));

  doing = "measuring the device";
  node_hello hello;
  hello.version = wire_protocol_version;
  hello.name = cfg.id.name;
  hello.site = cfg.id.site;
  // "cuda:0 (NVIDIA H100 80GB HBM3)": the coordinator compares the part before the blank with
  // the cluster file and prints the whole name.
  hello.device = cfg.id.device == "cpu" ? cfg.id.device : make_backend(cfg.id.device)->name();
  hello.host = cfg.host;
  hello.gflops = cpu::measure_sgemm_gflops();
  hello.memory_bytes = physical_memory();
  hello.pid = static_cast<int32_t>(getpid());

  // The coordinator may start after us: keep trying until join-timeout. After losing it, with
  // cluster.rejoin-timeout, the node stops its operators and tries again that long, so a
  // coordinator restarted with --resume on the same address takes it back, and a coordinator
  // that declared this node lost (a cut link) admits it again (docs/recovery.md).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.join_timeout_s);
  for (bool rejoining = false;; rejoining = true) {
    // A fresh actor system for every (re)join: the old one's actors and connections are gone
    // when it is destroyed (at the end of the iteration), and its middleman forgets the lost
    // coordinator. CAF 0.17's middleman answers a connect to host:port from a cache that kept
    // the dead proxy of a coordinator lost by a connection timeout (a cut link): requests to it
    // were dropped without an answer.
    doing = "starting the actor system";
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto exit_code = std::make_shared<std::atomic<int>>(1);
    auto routes = std::make_shared<route_table>();
    cfg.id.reverse = std::make_shared<reversal>(cfg.accept_inbound, cfg.host);
    auto node = spawn_node_actor(sys, cfg.id, exit_code, routes);
    watcher.set_target(me, node);
    if (cfg.data_port > 65535) {
      log_error(me, "node.data-port " + std::to_string(cfg.data_port) + " is not a port (0..65535)");
      anon_send_exit(node, caf::exit_reason::user_shutdown);
      return 2;
    }
    std::unique_ptr<data_channel_server> data;
    try {
      data = std::make_unique<data_channel_server>(cfg.host, static_cast<uint16_t>(cfg.data_port),
                                                   node, routes,
                                                   cfg.id.tls, cfg.id.reverse);
    } catch (const std::exception& e) {
      log_error(me, e.what());
      anon_send_exit(node, caf::exit_reason::user_shutdown);
      return 2;
    }
    hello.data_port = data->port();
    auto give_up = [&](int code) {
      self->send_exit(node, caf::exit_reason::user_shutdown);
      return code;
    };
    // Stopped by a signal: the node actor already has its exit; close the data channel before
    // the actor system stops (when `sys` goes out of scope).
    auto interrupted = [&]() {
      watcher.await_acted(500);
      stop_node(node);
      self->wait_for(node);
      data.reset();
      log_info(me, std::string("stopped by ") + signal_name(watcher.signal()) + ", exiting with status 130");
      return exit_interrupted;
    };
    const char* timeout_key = rejoining ? "cluster.rejoin-timeout" : "node.join-timeout";
    const double timeout_s = rejoining ? cfg.rejoin_timeout_s : cfg.join_timeout_s;

    doing = "joining the coordinator";
    caf::actor coordinator;
    std::string last_error;
    for (bool said = false;;) {
      if (watcher.stopping()) return interrupted();
      auto c = connect_actor(sys, coord_host, coord_port, tls);
      std::string why;  // a connection made but not usable, in plain words
      if (c && tls) {
        // The coordinator proves its role first, then this node answers its nonce
        // (actors/secure_link.hpp).
        auto challenge = challenge_server(self, *c, *creds, security::role::coordinator);
        if (challenge) {
          hello.proof = security::make_proof(*creds, *challenge);
        } else if (!rejoining) {
          log_error(me, "the coordinator at " + cfg.coordinator + " did not prove its identity: " + challenge.error());
          return give_up(2);
        } else {
          // Rejoining over a network that just came back, the connection may die in the
          // handshake: no verdict on the coordinator, tried again until rejoin-timeout.
          why = "the coordinator at " + cfg.coordinator + " did not prove its identity: " + challenge.error();
          log_warn(me, why + "; trying again");
          c = caf::make_error(caf::sec::cannot_connect_to_node);
        }
      }
      if (c) {
        coordinator = *c;
        break;
      }
      last_error = why.empty() ? describe_connect_error(c.error(), tls, "the coordinator at " + cfg.coordinator) : why;
      // A refused handshake will not succeed on the next try: say so now, not at join-timeout.
      // (Rejoining, it also ends a connection to the address of the coordinator that went
      // away, which is no verdict on the one to come: retried until rejoin-timeout.)
      if (c.error() == caf::sec::disconnect_during_handshake && !rejoining) {
        log_error(me, last_error);
        return give_up(2);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        log_error(me, "cannot reach the coordinator at " + cfg.coordinator + " within " + format_seconds(timeout_s) +
                          " (" + timeout_key + "): " + last_error);
        return give_up(1);
      }
      if (!said) log_info(me, "waiting for the coordinator at " + cfg.coordinator);
      said = true;
      for (int i = 0; i < 10 && !watcher.stopping(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }

    // The node actor learns its coordinator before the coordinator learns of the node: once
    // welcomed, spawn requests and wire chunks may reach the node actor at once, and a rejection
    // must already have somebody to be reported to. (Told after the welcome, from this thread, it
    // raced the coordinator's first messages on a loaded machine and lost reports.)
    bool told = false;
    self->request(node, std::chrono::seconds(10), coordinator_atom::value, caf::actor_cast<op_reporter>(coordinator))
        .receive([&](bool) { told = true; }, [&](caf::error& e) { last_error = describe(e); });
    if (!told) {
      log_error(me, "the node actor did not take its coordinator: " + last_error);
      return give_up(1);
    }
    int code = -1;
    self->request(caf::actor_cast<coordinator_hub>(coordinator), std::chrono::seconds(30), hello_atom::value, hello, node)
        .receive(
            [&](welcome_atom, int32_t index, uint32_t version) {
              if (version != wire_protocol_version) {
                log_error(me, "the coordinator speaks protocol version " + std::to_string(version) + ", this node " +
                                  std::to_string(wire_protocol_version) + ": run the same build everywhere");
                code = 2;
                return;
              }
              log_info(me, std::string(rejoining ? "rejoined" : "joined") + " the coordinator at " + cfg.coordinator +
                               " as node " + std::to_string(index) + " (" + hello.device + ", " +
                               std::to_string(static_cast<int>(hello.gflops)) + " GFLOP/s); " +
                               (hello.data_port ? "data channel on port " + std::to_string(hello.data_port)
                                                : std::string("accepts no inbound connection: it dials the data "
                                                              "channels of the nodes that send to it")) +
                               (tls ? ", TLS 1.3" : ", plaintext"));
            },
            [&](caf::error& e) {
              // A refusal (wrong name, version or device) says why in plain words; anything else
              // means the coordinator did not answer.
              if (code_of(e) == fusion_errc::refused) {
                log_error(me, "the coordinator refused this node: " + describe(e));
                code = 2;
                return;
              }
              log_error(me, "no answer from the coordinator at " + cfg.coordinator + ": " + describe(e));
              code = 1;
            });
    if (watcher.stopping()) return interrupted();
    if (code >= 0) return give_up(code);
    doing = "hosting operators";
    self->wait_for(node);
    if (watcher.stopping()) return interrupted();
    // Where this node's incoming tensors came from: connections its peers opened, and those it
    // opened itself because it accepts no inbound connection (or the cluster file says so).
    log_info(me, "data channel: accepted " + std::to_string(data->accepted()) + " connection(s), dialed " +
                     std::to_string(data->adopted()) + " to nodes that send to this one");
    if (exit_code->load() == 0) {
      log_info(me, "run ended, exiting");
      return 0;
    }
    // The node actor ends with 1 only when the coordinator went away (its operators stopped).
    if (cfg.rejoin_timeout_s <= 0) {
      log_error(me, "exiting after an error");
      return exit_code->load();
    }
    log_info(me, "trying to rejoin the coordinator at " + cfg.coordinator + " for " +
                     format_seconds(cfg.rejoin_timeout_s) + " (cluster.rejoin-timeout)");
    data.reset();
    watcher.set_target(me, node_actor{});  // its actor system ends with this iteration
    deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.rejoin_timeout_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    log_error("fusion-node", "out of memory while " + doing);
    return 1;
  } catch (const std::exception& e) {
    log_error("fusion-node", std::string("error: ") + e.what());
    return 2;
  }
}
