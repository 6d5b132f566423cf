// fusion-node: one process per device of a site. It joins the coordinator (fusion-train with a
// cluster file), reports its device profile and then hosts the operator actors placed on it.
//
//   fusion-node --config configs/nodes/site-a.ini [--node.coordinator=HOST:PORT] ...
//
// It exits 0 when the coordinator ends the run, 1 when the coordinator goes away or cannot be
// reached, 2 for a bad configuration or when the coordinator refuses it.
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "actors/data_channel.hpp"
#include "actors/messages.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_device.hpp"
#include "apps/app_options.hpp"
#include "core/cluster.hpp"
#include "core/wire.hpp"
#include "ops/cpu/blas.hpp"

namespace {

using namespace fusion;

struct node_app_config : table_config {
  node_identity id;
  std::string coordinator = "127.0.0.1:7700";
  std::string host = "127.0.0.1";
  uint64_t data_port = 0;
  double join_timeout_s = 60;
  int64_t heartbeat_ms = 250, peer_timeout_ms = 2000;
  uint64_t threads = 0, blas_threads = 1;
  std::string scheduler = "sharing";

  node_app_config() {
    add_rows({
        {"node", "name", "this node's name in the cluster file (required)", &id.name},
        {"node", "site", "the site it belongs to (informational; the cluster file decides)", &id.site},
        {"node", "device", "cpu, cuda or cuda:N: where this node's op actors compute (must match the cluster file)",
         &id.device},
        {"node", "coordinator", "HOST:PORT of the coordinator (fusion-train --cluster)", &coordinator},
        {"node", "host", "address other nodes reach this node on", &host},
        {"node", "data-port", "TCP port of the tensor data channel (0: any free port)", &data_port},
        {"node", "join-timeout", "seconds to keep trying to reach the coordinator", &join_timeout_s},
        {"cluster", "heartbeat-ms", "heartbeat interval in milliseconds (same as the coordinator's)", &heartbeat_ms},
        {"cluster", "peer-timeout-ms", "a silent coordinator is declared dead after this (milliseconds)",
         &peer_timeout_ms},
        {"runtime", "threads", "actor scheduler threads (0: one per core)", &threads},
        {"runtime", "blas-threads", "OpenBLAS threads per op call", &blas_threads},
        {"runtime", "scheduler", "actor scheduler: sharing (idle workers sleep) or stealing", &scheduler},
    });
  }
};

const char* usage =
    "usage: fusion-node --config FILE.ini [--node.name=NAME] [--node.coordinator=HOST:PORT] [--category.key=value ...]\n\n"
    "Joins a training run as one node of a cluster file: connects to the coordinator (fusion-train\n"
    "--cluster FILE), reports its device and hosts the operator actors placed on it until the run\n"
    "ends. See docs/cluster.md.\n";

uint64_t physical_memory() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

int run(int argc, char** argv) {
  node_app_config cfg;
  switch (load_options("fusion-node", usage, cfg, argc, argv, {{"--name", "node.name", true}})) {
    case load_result::exit_ok: return 0;
    case load_result::exit_usage: return 2;
    case load_result::run: break;
  }
  if (cfg.id.name.empty()) {
    std::cerr << "fusion-node: no node name: set [node] name in the config or pass --node.name=NAME\n";
    return 2;
  }
  if (auto why = device_problem(cfg.id.device); !why.empty()) {
    std::cerr << "fusion-node " << cfg.id.name << ": node.device: " << why << "\n";
    return 2;
  }
  cfg.id.device = normalize_device(cfg.id.device);
  auto [coord_host, coord_port] = parse_host_port(cfg.coordinator, "node.coordinator");
  const std::string me = "fusion-node " + cfg.id.name;
  set_liveness(cfg, cfg.heartbeat_ms, cfg.peer_timeout_ms);
  cfg.load<caf::io::middleman>();
  add_fusion_message_types(cfg);
  int threads = cfg.threads > 0 ? static_cast<int>(cfg.threads) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cfg.set("scheduler.max-threads", static_cast<int64_t>(std::max(1, threads)));
  set_scheduler_policy(cfg, cfg.scheduler);
  cpu::set_blas_threads(std::max<int>(1, static_cast<int>(cfg.blas_threads)));

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

  caf::actor_system sys{cfg};
  auto exit_code = std::make_shared<std::atomic<int>>(1);
  auto routes = std::make_shared<route_table>();
  auto node = spawn_node_actor(sys, cfg.id, exit_code, routes);
  if (cfg.data_port > 65535) {
    std::cerr << me << ": node.data-port " << cfg.data_port << " is not a port\n";
    anon_send_exit(node, caf::exit_reason::user_shutdown);
    return 2;
  }
  std::unique_ptr<data_channel_server> data;
  try {
    data = std::make_unique<data_channel_server>(cfg.host, static_cast<uint16_t>(cfg.data_port), node, routes);
  } catch (const std::exception& e) {
    std::cerr << me << ": " << e.what() << "\n";
    anon_send_exit(node, caf::exit_reason::user_shutdown);
    return 2;
  }
  hello.data_port = data->port();
  caf::scoped_actor self{sys};
  auto give_up = [&](int code) {
    self->send_exit(node, caf::exit_reason::user_shutdown);
    return code;
  };

  // The coordinator may start after us: keep trying until join-timeout.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.join_timeout_s);
  caf::actor coordinator;
  std::string last_error;
  for (bool said = false;;) {
    auto c = sys.middleman().remote_actor(coord_host, coord_port);
    if (c) {
      coordinator = *c;
      break;
    }
    last_error = sys.render(c.error());
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << me << ": cannot reach the coordinator at " << cfg.coordinator << " within "
                << cfg.join_timeout_s << " s (node.join-timeout): " << last_error << "\n";
      return give_up(1);
    }
    if (!said) std::cerr << me << ": waiting for the coordinator at " << cfg.coordinator << "\n";
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }

  int code = -1;
  self->request(coordinator, std::chrono::seconds(30), hello_atom::value, hello, node)
      .receive(
          [&](welcome_atom, int32_t index, uint32_t version, std::string& refusal) {
            if (!refusal.empty()) {
              std::cerr << me << ": the coordinator refused this node: " << refusal << "\n";
              code = 2;
              return;
            }
            if (version != wire_protocol_version) {
              std::cerr << me << ": the coordinator speaks protocol version " << version << ", this node "
                        << wire_protocol_version << ": run the same build everywhere\n";
              code = 2;
              return;
            }
            std::cerr << me << ": joined the coordinator at " << cfg.coordinator << " as node " << index << " ("
                      << hello.device << ", " << static_cast<int>(hello.gflops) << " GFLOP/s)\n";
            self->send(node, welcome_atom::value, coordinator);
          },
          [&](caf::error& e) {
            std::cerr << me << ": no answer from the coordinator at " << cfg.coordinator << ": " << sys.render(e)
                      << "\n";
            code = 1;
          });
  if (code >= 0) return give_up(code);
  self->wait_for(node);
  std::cerr << me << ": " << (exit_code->load() == 0 ? "run ended, exiting" : "exiting after an error") << "\n";
  return exit_code->load();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fusion-node: error: " << e.what() << "\n";
    return 2;
  }
}
