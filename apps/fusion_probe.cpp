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
#include <string>

#include "apps/cli.hpp"
#include "base/host_port.hpp"
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
    "the certificate of node NODE; measure checks that the server is node --peer. An IPv6\n"
    "address takes brackets: [::1]:7799.\n\n"
    "options:\n"
    "  --host H             serve: address to listen on (default: 0.0.0.0)\n"
    "  --port P             serve: port, 0 for any free one (default: 0)\n"
    "  --seconds S          measure: seconds measured (default: 2, at most 86400)\n"
    "  --warmup S           measure: seconds sent before measuring (default: 0.5, at most 86400)\n"
    "  --frame-kib K        measure: KiB per frame (default: 256, at most 1048576)\n"
    "  --security.certs DIR the run's certificates (--certs: the old spelling)\n"
    "  --node.name NODE     whose certificate this program uses (--name: the old spelling)\n"
    "  --peer NODE          measure: the node the server must prove to be\n\n"
    "examples:\n"
    "  fusion-probe serve --port 7799\n"
    "  fusion-probe measure 10.77.0.2:7799 --seconds 2 --security.certs runs/sites/certs --node.name a1 --peer b1\n\n"
    "exit codes: 0 done; 1 the link or the server failed; 2 bad usage\n";

// A number in [0, max], or a usage_error naming the flag. The bound keeps a converted count of
// milliseconds or bytes finite (1e400 reads as infinity).
double parse_number(const std::string& flag, const std::string& text, double max) {
  char* end = nullptr;
  const double out = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(out >= 0))
    throw fusion::usage_error(flag + " expects a non-negative number, got '" + text + "'");
  if (!(out <= max)) {
    throw fusion::usage_error(flag + " must be at most " + std::to_string(static_cast<int64_t>(max)) + ", got " + text);
  }
  return out;
}

// Upper bounds: a day of measuring, and a frame of 1 GiB (the data channel's frames hold 2 GiB).
constexpr double max_probe_seconds = 86400;
constexpr double max_frame_kib = 1 << 20;

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
  bool has_port = false, has_seconds = false, has_warmup = false, has_frame_kib = false;  ///< given at all
};

int serve(command_args& a) {
  fusion::net::frame_server_options opts;
  opts.host = a.host;
  tls_options& tls = a.tls;
  if (a.has_port) {
    const double v = parse_number("--port", a.port, 65535);
    if (v != static_cast<uint16_t>(v)) throw fusion::usage_error("--port expects a whole number, got " + a.port);
    opts.port = static_cast<uint16_t>(v);
  }
  auto ctx = tls.load(false);
  if (!ctx) throw fusion::usage_error(ctx.error());
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
  if (a.endpoint.empty()) throw fusion::usage_error("measure needs HOST:PORT");
  auto ep = fusion::split_host_port(a.endpoint);
  if (!ep) throw fusion::usage_error(ep.error());
  fusion::net::probe_options opts;
  tls_options& tls = a.tls;
  if (a.has_seconds)
    opts.duration = std::chrono::milliseconds(static_cast<int64_t>(parse_number("--seconds", a.seconds, max_probe_seconds) * 1000));
  if (a.has_warmup)
    opts.warmup = std::chrono::milliseconds(static_cast<int64_t>(parse_number("--warmup", a.warmup, max_probe_seconds) * 1000));
  if (a.has_frame_kib) opts.frame_bytes = static_cast<size_t>(parse_number("--frame-kib", a.frame_kib, max_frame_kib) * 1024);
  auto ctx = tls.load(true);
  if (!ctx) throw fusion::usage_error(ctx.error());
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
  fusion::cli::command_program program(usage_text, "fusion-probe " FUSION_VERSION " (wire protocol " +
                                                       std::to_string(fusion::wire_protocol_version) + ")");
  command_args a;
  CLI::App* serve_cmd = program.command("serve");
  CLI::App* measure_cmd = program.command("measure");
  program.option(serve_cmd, "--host", a.host);
  program.option(serve_cmd, "--port", a.port, &a.has_port);
  measure_cmd->add_option("endpoint", a.endpoint);
  program.option(measure_cmd, "--seconds", a.seconds, &a.has_seconds);
  program.option(measure_cmd, "--warmup", a.warmup, &a.has_warmup);
  program.option(measure_cmd, "--frame-kib", a.frame_kib, &a.has_frame_kib);
  program.option(measure_cmd, "--peer", a.tls.peer);
  for (auto* cmd : {serve_cmd, measure_cmd}) {
    program.option(cmd, "--security.certs,--certs", a.tls.certs);
    program.option(cmd, "--node.name,--name", a.tls.name);
  }
  const std::string cmd = program.parse(argc, argv);
  if (cmd == "serve") return serve(a);
  if (cmd == "measure") return measure(a);
  return 0;  // --help, help or --version
}

int main(int argc, char** argv) {
  return fusion::cli::run_main("fusion-probe", [&] { return run(argc, argv); }, "a smaller --frame-kib needs less");
}
