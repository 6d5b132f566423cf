// fusion-probe: link throughput probe over the bulk data channel (no CAF).
//
//   fusion-probe serve [--host H] [--port P] [--certs DIR --name NODE]
//                                                     prints "port=<bound port>", serves until killed
//   fusion-probe measure HOST:PORT [--seconds S] [--warmup S] [--frame-kib K]
//                        [--certs DIR --name NODE --peer NODE]
//                                                     prints "mbit=<value>" and a human line
//
// Used by the multi-site tests (network namespaces + tc) to compare measured link rates with
// the cluster file's configured ones. Plaintext unless --certs names a directory made by
// `fusion-cluster certs`: then TLS 1.3 as node NODE, exactly as between the nodes of a run.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>

#include "core/wire.hpp"
#include "net/frame_channel.hpp"
#include "net/link_probe.hpp"
#include "net/tls.hpp"
#include "security/certs.hpp"

namespace {

int usage(const char* why) {
  if (why && *why) std::cerr << "fusion-probe: " << why << "\n";
  std::cerr << "usage: fusion-probe serve [--host H] [--port P] [--certs DIR --name NODE]\n"
               "       fusion-probe measure HOST:PORT [--seconds S] [--warmup S] [--frame-kib K]\n"
               "                            [--certs DIR --name NODE --peer NODE]\n"
               "       fusion-probe --version\n"
               "Plaintext unless --certs names a directory made by `fusion-cluster certs`: then TLS 1.3\n"
               "with the certificate of node NODE; measure checks that the server is node --peer.\n";
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

// --certs DIR --name NODE [--peer NODE]: TLS settings, collected while the options are parsed.
struct tls_options {
  std::string certs, name, peer;
  bool take(const std::string& flag, const char* value) {
    if (flag == "--certs") certs = value;
    else if (flag == "--name") name = value;
    else if (flag == "--peer") peer = value;
    else return false;
    return true;
  }
  // The context, null in plaintext; an error message otherwise.
  std::shared_ptr<const fusion::net::tls_context> load(bool need_peer, std::string& error) const {
    if (certs.empty() && name.empty() && peer.empty()) return nullptr;
    if (certs.empty() || name.empty() || (need_peer && peer.empty())) {
      error = need_peer ? "TLS needs --certs, --name and --peer together" : "TLS needs --certs and --name together";
      return nullptr;
    }
    auto ctx = fusion::net::tls_context::load(
        fusion::security::files_in(certs, fusion::security::role::node, name));
    if (!ctx) error = ctx.error();
    return ctx ? *ctx : nullptr;
  }
};

int serve(int argc, char** argv) {
  fusion::net::frame_server_options opts;
  opts.host = "0.0.0.0";
  tls_options tls;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a != "--host" && a != "--port" && a != "--certs" && a != "--name")
      return usage(("unknown option " + a).c_str());
    if (i + 1 >= argc) return usage((a + " needs a value").c_str());
    double v = 0;
    if (tls.take(a, argv[i + 1])) {
      ++i;
    } else if (a == "--host") {
      opts.host = argv[++i];
    } else if (a == "--port") {
      if (!parse_number(a, argv[++i], v) || v > 65535) return 2;
      opts.port = static_cast<uint16_t>(v);
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  std::string error;
  opts.tls = tls.load(false, error);
  if (!error.empty()) return usage(error.c_str());
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

int measure(int argc, char** argv) {
  if (argc < 3) return usage("measure needs HOST:PORT");
  auto ep = fusion::net::parse_endpoint(argv[2]);
  if (!ep) return usage((std::string("bad endpoint '") + argv[2] + "' (expected HOST:PORT)").c_str());
  fusion::net::probe_options opts;
  tls_options tls;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage((a + " needs a value").c_str());
    if (tls.take(a, argv[++i])) continue;
    double v = 0;
    if (!parse_number(a, argv[i], v)) return 2;
    if (a == "--seconds") {
      opts.duration = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
    } else if (a == "--warmup") {
      opts.warmup = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
    } else if (a == "--frame-kib") {
      opts.frame_bytes = static_cast<size_t>(v * 1024);
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  std::string error;
  opts.tls = tls.load(true, error);
  if (!error.empty()) return usage(error.c_str());
  opts.peer = {fusion::security::role::node, tls.peer};
  auto r = fusion::net::probe_link(ep->first, ep->second, opts);
  if (!r) {
    std::cerr << "fusion-probe: " << r.error() << "\n";
    return 1;
  }
  std::printf("mbit=%.3f\n", r->mbit_per_s);
  std::printf("%s: %.1f Mbit/s (%.2f MiB in %.3f s after %.1f s warm-up), rtt %.3f ms\n", argv[2],
              r->mbit_per_s, r->bytes / 1048576.0, r->seconds, opts.warmup.count() / 1000.0, r->rtt_ms);
  return 0;
}

}  // namespace

static int run(int argc, char** argv) {
  if (argc < 2) return usage("");
  std::string cmd = argv[1];
  if (cmd == "serve") return serve(argc, argv);
  if (cmd == "measure") return measure(argc, argv);
  if (cmd == "--help" || cmd == "-h") return usage("") == 2 ? 0 : 0;
  if (cmd == "--version") {
    std::printf("fusion-probe %s (wire protocol %u)\n", FUSION_VERSION,
                static_cast<unsigned>(fusion::wire_protocol_version));
    return 0;
  }
  return usage(("unknown command '" + cmd + "'").c_str());
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
