// fusion-cluster: validates a cluster file, prints the placement of a model on it, and prints the
// cluster in a line format for shell scripts (scripts/sites.sh reads it; it never parses pbtxt).
// Plain main() without CAF. Exit codes: 0 ok, 2 bad usage or bad file (message on stderr).
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "core/wire.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"

namespace {

using namespace fusion;

constexpr const char* usage_text =
    R"(usage: fusion-cluster check CLUSTER [--model FILE] [--batch N]
       fusion-cluster netns CLUSTER
       fusion-cluster --help | --version

check   validates the cluster file (format: docs/cluster.md) and prints its sites, nodes and
        links. With --model, also loads the model for (micro-)batch size N (default 8) and
        prints the plan of a run: the placement of its operators on the nodes (policy from the
        cluster file; per node the ops, their estimated FLOPs per step and share, every
        cross-node edge), then the plan's edges, one line per direction of every cross-node
        edge: id, fwd/bwd, producer -> consumer, from -> to node, bytes per micro-batch, codec.
netns   prints the cluster for shell scripts, one item per line, fields separated by spaces:
          site NAME INDEX            (INDEX from 1, file order)
          node NAME SITE DEVICE
          link SITE_A SITE_B MBIT    (each direction; site pairs without a line are unshaped)
          coordinator HOST PORT
        scripts/sites.sh reads it to build the network-namespace emulation of the sites.

Errors go to stderr as FILE:LINE: message; the exit code is then 2.
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string mbit_text(double mbit) {
  std::ostringstream s;
  s << mbit;
  return s.str();
}

void print_netns(const cluster_spec& c) {
  for (size_t i = 0; i < c.sites.size(); ++i) std::cout << "site " << c.sites[i].name << " " << i + 1 << "\n";
  for (auto& n : c.nodes) std::cout << "node " << n.name << " " << n.site << " " << n.device << "\n";
  for (auto& l : c.links) std::cout << "link " << l.a << " " << l.b << " " << mbit_text(l.mbit) << "\n";
  std::cout << "coordinator " << c.coordinator_host << " " << c.coordinator_port << "\n";
}

void print_summary(const cluster_spec& c) {
  std::cout << c.file << ": cluster '" << c.name << "' is valid: " << c.sites.size() << " sites, " << c.nodes.size()
            << " nodes, " << c.links.size() << " links, coordinator " << c.coordinator_host << ":"
            << (c.coordinator_port == 0 ? std::string("any") : std::to_string(c.coordinator_port)) << ", placement "
            << placement_policy_names()[static_cast<int>(c.placement.policy)] << "\n";
  for (auto& s : c.sites) {
    std::cout << "  site " << s.name << ":";
    for (auto& n : c.nodes)
      if (n.site == s.name) std::cout << " " << n.name << " (" << n.device << ")";
    std::cout << "\n";
  }
  for (size_t a = 0; a < c.sites.size(); ++a)
    for (size_t b = a + 1; b < c.sites.size(); ++b) {
      double m = c.link_mbit(c.sites[a].name, c.sites[b].name);
      std::cout << "  link " << c.sites[a].name << " <-> " << c.sites[b].name << ": "
                << (std::isinf(m) ? std::string("unshaped") : mbit_text(m) + " Mbit/s") << "\n";
    }
}

int64_t parse_batch(const std::string& v) {
  char* end = nullptr;
  long long b = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || b < 1) throw usage_error("--batch needs an integer >= 1, got '" + v + "'");
  return b;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) throw usage_error("missing command (check or netns)");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << usage_text;
    return 0;
  }
  if (args[0] == "--version") {
    std::cout << "fusion-cluster " << FUSION_VERSION << " (wire protocol " << wire_protocol_version << ")\n";
    return 0;
  }
  const std::string& cmd = args[0];
  if (cmd != "check" && cmd != "netns") throw usage_error("unknown command '" + cmd + "' (check or netns)");
  std::string cluster_file, model_file;
  int64_t batch = 8;
  bool batch_given = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= args.size()) throw usage_error(flag + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage_text;
      return 0;
    } else if (cmd == "check" && a == "--model") {
      model_file = value(a);
    } else if (cmd == "check" && a.rfind("--model=", 0) == 0) {
      model_file = a.substr(8);
    } else if (cmd == "check" && a == "--batch") {
      batch = parse_batch(value(a));
      batch_given = true;
    } else if (cmd == "check" && a.rfind("--batch=", 0) == 0) {
      batch = parse_batch(a.substr(8));
      batch_given = true;
    } else if (a.rfind("-", 0) == 0) {
      throw usage_error("unknown option '" + a + "' for " + cmd);
    } else if (cluster_file.empty()) {
      cluster_file = a;
    } else {
      throw usage_error("unexpected argument '" + a + "'");
    }
  }
  if (cluster_file.empty()) throw usage_error(cmd + " needs a CLUSTER file");
  if (batch_given && model_file.empty()) throw usage_error("--batch needs --model");
  cluster_spec c = load_cluster(cluster_file);
  if (cmd == "netns") {
    print_netns(c);
    return 0;
  }
  print_summary(c);
  if (!model_file.empty()) {
    graph g = load_graph(model_file, batch);
    plan p = plan_run(g, c, profile_from_cluster(c));
    std::cout << format_plan(g, c, p);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const usage_error& e) {
    std::cerr << "fusion-cluster: " << e.what() << "\n(fusion-cluster --help for usage)\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
  }
  return 2;
}
