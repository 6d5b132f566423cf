// fusion-probe: link throughput probe over the bulk data channel (no CAF).
//
//   fusion-probe serve [--host H] [--port P] [--security.certs DIR --node.name NODE]
//                                                     prints "port=<bound port>", serves until killed
//   fusion-probe measure HOST:PORT [--seconds S] [--warmup S] [--frame-kib K]
//                        [--security.certs DIR --node.name NODE --peer NODE]
//                                                     prints "mbit=<value>" and a human line
//
// Used by the multi-site tests (network namespaces + tc) to compare measured link rates with
// the cluster file's configured ones. Plaintext unless --security.certs names a directory made by
// `fusion-cluster certs`: then TLS 1.3 as node NODE, exactly as between the nodes of a run.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <set>
#include <string>

#include "apps/cli.hpp"
#include "core/graph_names.hpp"
#include "core/wire.hpp"
#include "net/frame_channel.hpp"
#include "net/link_probe.hpp"
#include "net/tls.hpp"
#include "security/certs.hpp"

namespace {

const char* usage_text =
    "usage: fusion-probe serve [--host H] [--port P] [--security.certs DIR --node.name NODE]\n"
    "       fusion-probe measure HOST:PORT [--seconds S] [--warmup S] [--frame-kib K]\n"
    "                            [--security.certs DIR --node.name NODE --peer NODE]\n"
    "       fusion-probe --help | --version\n\n"
    "Measures a link's throughput over the data channel of a run (docs/transport.md). Plaintext\n"
    "unless --security.certs names a directory made by `fusion-cluster certs`: then TLS 1.3 with\n"
    "the certificate of node NODE; measure checks that the server is node --peer.\n\n"
    "options:\n"
    "  --host H             serve: address to listen on (default: 0.0.0.0)\n"
    "  --port P             serve: port, 0 for any free one (default: 0)\n"
    "  --seconds S          measure: seconds measured (default: 2)\n"
    "  --warmup S           measure: seconds sent before measuring (default: 0.5)\n"
    "  --frame-kib K        measure: KiB per frame (default: 256)\n"
    "  --security.certs DIR the run's certificates (--certs: the old spelling)\n"
    "  --node.name NODE     whose certificate this program uses (--name: the old spelling)\n"
    "  --peer NODE          measure: the node the server must prove to be\n\n"
    "examples:\n"
    "  fusion-probe serve --port 7799\n"
    "  fusion-probe measure 10.77.0.2:7799 --seconds 2 --security.certs runs/sites/certs --node.name a1 --peer b1\n\n"
    "exit codes: 0 done; 1 the link or the server failed; 2 bad usage\n";

int usage(const char* why) {
  if (why && *why) std::cerr << "fusion-probe: " << why << " (see --help)\n";
  else std::cerr << usage_text;
  return 2;
}

// Parses a non-negative number or reports which flag was bad.
bool parse_number(const std::string& flag, const std::string& text, double& out) {
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(out >= 0)) {
    std::cerr << "fusion-probe: " << flag << " expects a non-negative number, got '" << text << "'\n";
    return false;
  }
  return true;
}

// --certs DIR --name NODE [--peer NODE]: TLS settings.
struct tls_options {
  std::string certs, name, peer;
  // The context, null in plaintext.
  fusion::result<std::shared_ptr<const fusion::net::tls_context>> load(bool need_peer) const {
    if (certs.empty() && name.empty() && peer.empty()) return std::shared_ptr<const fusion::net::tls_context>();
    if (certs.empty() || name.empty() || (need_peer && peer.empty()))
      return fusion::fail(need_peer ? "TLS needs --security.certs, --node.name and --peer together"
                                    : "TLS needs --security.certs and --node.name together");
    return fusion::net::tls_context::load(fusion::security::files_in(certs, fusion::security::role::node, name));
  }
};

/// What the command line of a command gives; the fields a command lacks stay empty.
struct command_args {
  std::string host = "0.0.0.0", endpoint;
  std::string port, seconds, warmup, frame_kib;  ///< checked by parse_number once parsing is done
  tls_options tls;
  std::set<std::string> given;  ///< the options on the command line ("--port")
};

int serve(command_args& a) {
  fusion::net::frame_server_options opts;
  opts.host = a.host;
  tls_options& tls = a.tls;
  if (a.given.count("--port")) {
    double v = 0;
    if (!parse_number("--port", a.port, v)) return 2;
    if (v > 65535) {
      std::cerr << "fusion-probe: --port must be at most 65535, got " << a.port << "\n";
      return 2;
    }
    opts.port = static_cast<uint16_t>(v);
  }
  auto ctx = tls.load(false);
  if (!ctx) return usage(ctx.error().c_str());
  opts.tls = *ctx;
  // Block the stop signals before any thread starts so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto server = fusion::net::frame_server::start(
      opts,
      // A probe server has no tensor consumers: data frames are refused (and drained).
      [](fusion::net::incoming_frame&) { return fusion::net::frame_target::refuse("probe server takes probe frames only"); },
      [](const fusion::net::channel_error& e) { std::cerr << "fusion-probe: " << e.message << "\n"; });
  if (!server) {
    std::cerr << "fusion-probe: " << server.error() << "\n";
    return 1;
  }
  std::cout << "port=" << (*server)->port() << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*server)->stop();
  auto s = (*server)->stats();
  std::cerr << "fusion-probe: stopped; " << s.connections << " connections, " << s.probe_bytes
            << " probe bytes\n";
  return 0;
}

int measure(command_args& a) {
  if (a.endpoint.empty()) return usage("measure needs HOST:PORT");
  auto ep = fusion::net::parse_endpoint(a.endpoint);
  if (!ep) return usage(("bad endpoint '" + a.endpoint + "' (expected HOST:PORT)").c_str());
  fusion::net::probe_options opts;
  tls_options& tls = a.tls;
  double v = 0;
  if (a.given.count("--seconds")) {
    if (!parse_number("--seconds", a.seconds, v)) return 2;
    opts.duration = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
  }
  if (a.given.count("--warmup")) {
    if (!parse_number("--warmup", a.warmup, v)) return 2;
    opts.warmup = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
  }
  if (a.given.count("--frame-kib")) {
    if (!parse_number("--frame-kib", a.frame_kib, v)) return 2;
    opts.frame_bytes = static_cast<size_t>(v * 1024);
  }
  auto ctx = tls.load(true);
  if (!ctx) return usage(ctx.error().c_str());
  opts.tls = *ctx;
  opts.peer = {fusion::security::role::node, tls.peer};
  auto r = fusion::net::probe_link(ep->first, ep->second, opts);
  if (!r) {
    std::cerr << "fusion-probe: " << r.error() << "\n";
    return 1;
  }
  std::printf("mbit=%.3f\n", r->mbit_per_s);
  std::printf("%s: %.1f Mbit/s (%.2f MiB in %.3f s after %.1f s warm-up), rtt %.3f ms\n", a.endpoint.c_str(),
              r->mbit_per_s, r->bytes / 1048576.0, r->seconds, opts.warmup.count() / 1000.0, r->rtt_ms);
  return 0;
}

}  // namespace

static int run(int argc, char** argv) {
  if (argc < 2) return usage("");
  CLI::App app;
  app.set_help_flag("-h,--help");
  bool version = false;
  app.add_flag("--version", version)->disable_flag_override();
  command_args a;
  auto add = [](CLI::App* cmd, const char* flag, std::string& target) {
    cmd->add_option(flag, target)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  auto* serve_cmd = app.add_subcommand("serve");
  auto* measure_cmd = app.add_subcommand("measure");
  add(serve_cmd, "--host", a.host);
  add(serve_cmd, "--port", a.port);
  measure_cmd->add_option("endpoint", a.endpoint);
  add(measure_cmd, "--seconds", a.seconds);
  add(measure_cmd, "--warmup", a.warmup);
  add(measure_cmd, "--frame-kib", a.frame_kib);
  add(measure_cmd, "--peer", a.tls.peer);
  for (auto* cmd : {serve_cmd, measure_cmd}) {
    add(cmd, "--security.certs,--certs", a.tls.certs);
    add(cmd, "--node.name,--name", a.tls.name);
    // The commands have no --help (only the program has); unknown options, --help among them,
    // and stray arguments are reported below.
    cmd->set_help_flag();
    cmd->allow_extras();
  }
  app.require_subcommand(0, 1);  // a later "serve" is an argument of the first command
  app.allow_extras();
  bool help = false;
  try {
    help = !fusion::cli::parse(app, argc, argv, [](const std::string& flag) { return flag + " needs a value"; });
  } catch (const fusion::usage_error& e) {
    return usage(e.what());
  }
  if (help) {
    std::cout << usage_text;
    return 0;
  }
  if (auto extra = app.remaining(); !extra.empty())
    return usage(("unknown command '" + extra.front() + "'").c_str());
  if (version) {
    std::printf("fusion-probe %s (wire protocol %u)\n", FUSION_VERSION,
                static_cast<unsigned>(fusion::wire_protocol_version));
    return 0;
  }
  auto* cmd = serve_cmd->parsed() ? serve_cmd : measure_cmd->parsed() ? measure_cmd : nullptr;
  if (!cmd) return usage("");
  if (auto extra = cmd->remaining(); !extra.empty()) {
    auto flag = fusion::cli::flag_of(extra.front());
    if (flag.size() > 1 && flag[0] == '-')
      return usage(("unknown option " + flag + fusion::did_you_mean(flag, fusion::cli::option_names(*cmd))).c_str());
    return usage(("unexpected argument '" + extra.front() + "'").c_str());
  }
  for (const auto* opt : cmd->get_options())
    if (opt->count() > 0)
      for (auto& n : opt->get_lnames()) a.given.insert("--" + n);
  return cmd == serve_cmd ? serve(a) : measure(a);
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "fusion-probe: out of memory (a smaller --frame-kib needs less)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "fusion-probe: error: " << e.what() << "\n";
    return 1;
  }
}
