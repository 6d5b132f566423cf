// fusion-admin: the admin shell of a running coordinator (docs/admin.md).
//
//   fusion-admin HOST:PORT                       interactive prompt (stdin a terminal) or a script on stdin
//   fusion-admin HOST:PORT -c "status; nodes"    run the commands and exit
//   fusion-admin HOST:PORT -c status --json      one raw JSON object per reply
//   fusion-admin HOST:PORT watch [SECONDS]       status, nodes and links redrawn in place
//
// It connects to the admin actor fusion-train publishes on admin.port. Exit codes: 0 fine, 1 a
// command failed (in -c or script mode), the coordinator cannot be reached or went away, 2 bad
// usage. The parsing and rendering live in apps/admin_shell.hpp; this file does the CAF and
// terminal parts.
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <editline/readline.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

#include "actors/admin_protocol.hpp"
#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/secure_link.hpp"
#include "actors/node_actor.hpp"
#include "apps/admin_shell.hpp"
#include "apps/cli.hpp"
#include "apps/peer_check.hpp"
#include "core/cluster.hpp"
#include "core/log.hpp"
#include "core/wire.hpp"
#include "security/certs.hpp"

namespace {

using namespace fusion;

const char* usage =
    "usage: fusion-admin HOST:PORT [-c \"COMMAND; COMMAND ...\"] [--json] [--timeout SECONDS]\n"
    "                    [--security.certs DIR | --security.mode off] [--security.ca|certificate|key FILE]\n"
    "       fusion-admin HOST:PORT watch [SECONDS] [--security.* ...]\n"
    "       fusion-admin --help | --version\n\n"
    "Connects to a running fusion-train's admin shell (fusion-train --admin.port=PORT) and asks it\n"
    "about the run: status, nodes, placement, ops, links ('help' lists every command). With -c the\n"
    "commands run and the program exits; otherwise commands are read at a prompt (a terminal) or\n"
    "line by line from stdin (a script). `watch` redraws the run's status (with the scheduler's last\n"
    "verdict), nodes and links every SECONDS (default 2) in place, like top; plain frames one after\n"
    "the other when stdout is not a terminal. It ends with the run (exit 0) or on Ctrl-C. See docs/admin.md.\n\n"
    "examples:\n"
    "  fusion-admin 127.0.0.1:7070 --security.certs=runs/char-tiny/admin-certs -c \"status; nodes\"\n"
    "  fusion-admin 127.0.0.1:7070 --security.certs=runs/char-tiny/admin-certs watch 1\n\n"
    "options:\n"
    "  -c, --command TEXT   run these commands (separated by ';') and exit\n"
    "  --json               print each reply as one raw JSON object per line\n"
    "  --timeout SECONDS    how long to wait for a connection and for each reply (default 10)\n"
    "  --security.certs DIR the run's certificates (fusion-cluster certs): the shell logs in with\n"
    "                       DIR/admin.pem and DIR/admin.key over mutual TLS (docs/security.md)\n"
    "  --security.ca, --security.certificate, --security.key FILE   explicit files instead\n"
    "  --security.mode off  plaintext, for a fusion-train run with security.mode=off\n"
    "  -h, --help           this text\n"
    "  --version            the program and protocol versions\n\n"
    "exit codes: 0 fine; 1 a command failed, the coordinator cannot be reached or went away; 2 bad usage\n";

// Liveness of the connection (as fusion-node does against the coordinator): heartbeats both ways,
// so a coordinator that hangs (SIGSTOP) is declared gone too, not only one whose socket closes.
constexpr int64_t heartbeat_ms = 250, peer_timeout_ms = 2000;

struct options {
  std::string address, host, commands;
  uint16_t port = 0;
  bool have_commands = false, json = false;
  bool watch = false;       ///< `watch [SECONDS]`
  double watch_s = 2;
  double timeout_s = 10;
  security::security_settings security;
};

/// -1: go on; otherwise the exit code.
int parse_args(int argc, char** argv, options& o) {
  CLI::App app;
  app.set_help_flag("-h,--help");
  bool version = false;
  std::vector<std::string> commands;
  std::string timeout;
  app.add_flag("--version", version)->disable_flag_override();
  // One value per -c (CLI11 lets a vector option take every word that follows, the address too).
  app.add_option("-c,--command", commands)->allow_extra_args(false);
  app.add_flag("--json", o.json)->disable_flag_override();
  app.add_option("--timeout", timeout)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (auto [flag, target] : {std::pair{"--security.certs", &o.security.certs}, {"--security.mode", &o.security.mode},
                              {"--security.ca", &o.security.files.ca},
                              {"--security.certificate", &o.security.files.certificate},
                              {"--security.key", &o.security.files.key}})
    app.add_option(flag, *target)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("address", o.address);
  // Unknown options and a second address are reported below, in our words.
  app.allow_extras();
  try {
    bool help = !cli::parse(app, argc, argv, [](const std::string& flag) {
      if (flag == "-c" || flag == "--command") return flag + " needs the commands to run";
      if (flag == "--timeout") return std::string("--timeout needs a number of seconds");
      return flag + " needs a value";
    });
    if (help) {
      std::cout << usage;
      return 0;
    }
    if (version) {
      std::cout << "fusion-admin " << FUSION_VERSION << " (wire protocol " << wire_protocol_version << "), CAF "
                << CAF_MAJOR_VERSION << "." << CAF_MINOR_VERSION << "." << CAF_PATCH_VERSION << "\n";
      return 0;
    }
    auto extra = app.remaining();
    if (!extra.empty() && extra.front() == "watch") {
      o.watch = true;
      if (extra.size() > 1 && !(extra[1].size() > 1 && extra[1][0] == '-')) {
        char* end = nullptr;
        o.watch_s = std::strtod(extra[1].c_str(), &end);
        if (*end || !(o.watch_s >= 0.1) || o.watch_s > 3600)
          throw usage_error("watch " + extra[1] + ": expected seconds between redraws, 0.1 to 3600, e.g. watch 2");
        extra.erase(extra.begin());
      }
      extra.erase(extra.begin());
    }
    if (!extra.empty()) {
      const std::string& a = extra.front();
      if (a.size() > 1 && a[0] == '-') throw usage_error(cli::unknown_option(cli::flag_of(a), cli::option_names(app)));
      // A word that is no address is a command: `watch` is the only one.
      if (a.find(':') == std::string::npos) throw usage_error(cli::unknown_command(a, {"watch"}));
      throw usage_error("one coordinator address expected, got '" + o.address + "' and '" + a + "'");
    }
    if (o.watch && !commands.empty()) throw usage_error("watch and -c cannot be combined: one or the other");
    for (auto& c : commands) o.commands += (o.have_commands ? "; " : "") + c;
    o.have_commands = !commands.empty();
    if (app.count("--timeout") > 0) {
      char* end = nullptr;
      o.timeout_s = std::strtod(timeout.c_str(), &end);
      if (timeout.empty() || *end || !(o.timeout_s > 0) || o.timeout_s > 86400)
        throw usage_error("--timeout " + timeout + ": expected seconds above 0 and at most 86400 (a day), e.g. --timeout 2.5");
    }
    if (o.address.empty()) throw usage_error("no coordinator address: fusion-admin HOST:PORT");
    std::tie(o.host, o.port) = parse_host_port(o.address, "coordinator address");
    if (o.port == 0) throw usage_error("coordinator address " + o.address + ": port 0 is not a port one can connect to");
  } catch (const std::exception& e) {  // usage_error, and parse_host_port's errors
    std::cerr << "fusion-admin: " << e.what() << " (see --help)\n";
    return 2;
  }
  return -1;
}

/// Set by the watcher actor when the coordinator goes away; the pipe wakes a waiting poll() at once.
struct coordinator_watch {
  std::atomic<bool> gone{false};
  std::mutex mutex;
  std::string reason;
  int pipe_fds[2] = {-1, -1};

  void set_gone(std::string why) {
    std::unique_lock<std::mutex> guard{mutex};
    reason = std::move(why);
    guard.unlock();
    gone = true;
    char c = 1;
    [[maybe_unused]] auto n = ::write(pipe_fds[1], &c, 1);
  }
  std::string why() {
    std::lock_guard<std::mutex> guard{mutex};
    return reason;
  }
};

// libedit calls plain C functions, which reach the watch through this.
coordinator_watch* the_watch = nullptr;

/// Waits until `fd` has input (true) or the coordinator is gone (false).
bool wait_for_input(int fd) {
  for (;;) {
    if (the_watch->gone) return false;
    pollfd p[2] = {{fd, POLLIN, 0}, {the_watch->pipe_fds[0], POLLIN, 0}};
    int n = ::poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (the_watch->gone) return false;
    if (n < 0 || p[0].revents) return true;  // readable, EOF or an error: read() tells which
  }
}

// readline's character source: a blocking read that gives up (end of input) when the
// coordinator goes away, so a session idle at the prompt ends at once rather than on Enter.
extern "C" int admin_getc(FILE* in) {
  int fd = fileno(in);
  for (;;) {
    if (!wait_for_input(fd)) return EOF;
    unsigned char c = 0;
    auto n = ::read(fd, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) continue;
    return EOF;
  }
}

bool at_eof = false;  // stdin has ended

/// One line of a script on stdin; false at the end of input or when the coordinator is gone.
bool read_script_line(std::string& line) {
  static std::string pending;
  for (;;) {
    if (auto nl = pending.find('\n'); nl != std::string::npos) {
      line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      return true;
    }
    if (at_eof) {
      line = std::move(pending);
      pending.clear();
      return !line.empty();
    }
    if (!wait_for_input(STDIN_FILENO)) return false;
    char buf[4096];
    auto n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) at_eof = true;
    else pending.append(buf, static_cast<size_t>(n));
  }
}

// libedit asks for the matches one by one; complete_command has computed them already.
std::vector<std::string> matches;

char* next_match(const char*, int state) {
  static size_t next = 0;
  next = state == 0 ? 0 : next;
  return next < matches.size() ? ::strdup(matches[next++].c_str()) : nullptr;
}

// Command names only (admin::completions_in says where), never file names.
char** complete_command(const char* text, int start, int) {
  rl_attempted_completion_over = 1;
  size_t n = rl_line_buffer ? std::strlen(rl_line_buffer) : 0;
  matches = admin::completions_in(std::string(rl_line_buffer ? rl_line_buffer : "", std::min(n, size_t(start))), text);
  return matches.empty() ? nullptr : rl_completion_matches(text, next_match);
}

/// True for request failures that mean the coordinator is no longer there.
bool peer_gone(const caf::error& e) {
  if (e.category() == caf::atom("exit")) return true;
  if (e.category() != caf::atom("system")) return false;
  switch (static_cast<caf::sec>(e.code())) {
    case caf::sec::request_receiver_down:
    case caf::sec::no_route_to_receiving_node:
    case caf::sec::cannot_forward_to_invalid_actor:
    case caf::sec::connection_timeout:
    case caf::sec::socket_disconnected:
      return true;
    default:
      return false;
  }
}

enum class mode { one_shot, script, interactive };

/// Runs the commands of each line against the admin actor and keeps the exit code.
class shell {
 public:
  shell(caf::actor_system& sys, admin_actor admin, const options& o, mode m)
      : self_(sys), admin_(std::move(admin)), opt_(o), mode_(m) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", o.timeout_s);
    seconds_ = buf;
  }

  /// False when the shell ends: `quit`, or the coordinator went away.
  bool run_line(const std::string& line) {
    ++line_no_;
    auto parsed = admin::parse_line(line);
    if (!parsed.error.empty()) {
      report(parsed.error);
      return true;
    }
    for (auto& c : parsed.commands)
      if (!run_command(c)) return false;
    return true;
  }

  /// The coordinator went away (says so once) or the watcher saw it.
  bool gone() {
    if (the_watch->gone && !said_gone_) went_away(the_watch->why());
    return said_gone_;
  }
  int exit_code() const { return said_gone_ || failed_ ? 1 : 0; }

 private:
  bool run_command(const admin::command& c) {
    if (c.spec->kind == admin::command_kind::quit) return false;
    if (c.spec->kind == admin::command_kind::help) {
      std::cout << admin::help_text(c.args.empty() ? std::string() : c.args[0]) << std::flush;
      return true;
    }
    auto timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(opt_.timeout_s));
    std::string reply;
    caf::error err;
    auto on_reply = [&](std::string& r) { reply = std::move(r); };
    auto on_error = [&](caf::error& e) { err = std::move(e); };
    if (c.spec->kind == admin::command_kind::query)
      self_->request(admin_, timeout, query_atom::value, c.name).receive(on_reply, on_error);
    else
      self_->request(admin_, timeout, command_atom::value, c.name, c.args).receive(on_reply, on_error);
    if (err) {
      if (peer_gone(err)) return went_away(describe(err)), false;
      if (gone()) return false;
      if (err == caf::sec::request_timeout)
        report(c.name + ": no answer from the coordinator within " + seconds_ + " s (--timeout)" +
               (c.spec->kind == admin::command_kind::verb ? "; it may still carry it out: check 'status'" : ""));
      else report(c.name + ": " + describe(err));
      return true;
    }
    auto j = nlohmann::json::parse(reply, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      report(c.name + ": the coordinator's answer is not a JSON object: " + reply.substr(0, 200));
      return true;
    }
    std::cout << (opt_.json ? j.dump() + "\n" : admin::render(c.name, j)) << std::flush;
    // `rebalance` shows the move; at the prompt the user confirms it (scripts pass -y).
    if (c.name == "rebalance" && c.args.empty() && j.contains("apply") && mode_ == mode::interactive) {
      char* answer = readline("apply this move now? [y/N] ");
      const bool yes = answer && (answer[0] == 'y' || answer[0] == 'Y');
      std::free(answer);
      if (yes) return run_command(admin::command{c.spec, c.name, {"-y"}});
    }
    return true;
  }

  void report(const std::string& message) {
    failed_ |= mode_ != mode::interactive;  // an interactive user sees it and goes on
    if (mode_ == mode::interactive) std::cerr << "error: " << message << "\n";
    else if (mode_ == mode::script) std::cerr << "fusion-admin: line " << line_no_ << ": " << message << "\n";
    else std::cerr << "fusion-admin: " << message << "\n";
  }

  void went_away(const std::string& why) {
    if (said_gone_) return;
    said_gone_ = true;
    if (mode_ == mode::interactive) std::cerr << "\n";
    std::cerr << "fusion-admin: the coordinator at " << opt_.address << " went away: " << why << "\n";
  }

  caf::scoped_actor self_;
  admin_actor admin_;
  const options& opt_;
  mode mode_;
  std::string seconds_;  // the timeout as the user wrote it: "10", "2.5"
  int line_no_ = 0;
  bool failed_ = false, said_gone_ = false;
};

/// Why the connection to the coordinator failed, found by connecting again by hand (CAF says
/// "cannot connect" alike for a closed port, a plaintext program and a TLS peer of another CA);
/// empty when the TCP and TLS levels look fine.
std::string why_not_connected(const options& o, const security::credentials* creds) {
  auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(o.timeout_s));
  return diagnose_connect(o.address, o.host, o.port, creds ? &creds->files() : nullptr, timeout);
}

/// Connects within the timeout: a blocking connect to an address that drops packets could
/// otherwise wait for minutes.
caf::expected<admin_actor> connect(caf::actor_system& sys, const options& o, const security::credentials* creds) {
  auto done = std::make_shared<std::promise<caf::expected<admin_actor>>>();
  auto result = done->get_future();
  const bool tls = creds != nullptr;
  std::thread worker{[&sys, o, done, tls] { done->set_value(connect_actor<admin_actor>(sys, o.host, o.port, tls)); }};
  if (result.wait_for(std::chrono::duration<double>(o.timeout_s)) != std::future_status::ready) {
    const std::string why = why_not_connected(o, creds);
    std::cerr << "fusion-admin: cannot connect to the coordinator at " << o.address << ": "
              << (why.empty() ? "no answer within " + format_seconds(o.timeout_s) : why) << "\n";
    std::cout.flush();
    std::_Exit(1);  // the connect thread cannot be stopped; nothing else is running yet
  }
  worker.join();
  return result.get();
}

/// The coordinator proves its role, then this shell logs in with the admin certificate.
status log_in(caf::actor_system& sys, const admin_actor& admin, const security::credentials& creds,
              const options& o) {
  caf::scoped_actor self{sys};
  std::string error;
  auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(o.timeout_s));
  std::string challenge;
  self->request(admin, timeout, challenge_atom::value, security::random_nonce())
      .receive([&](std::string& theirs, security::proof& p) {
                 auto who = security::check_proof(creds, p, security::role::coordinator, {});
                 if (who) challenge = theirs;
                 else error = who.error();
               },
               [&](caf::error& e) { error = describe(e); });
  if (challenge.empty()) return fail("the coordinator at " + o.address + " did not prove its identity: " + error);
  self->request(admin, timeout, login_atom::value, security::make_proof(creds, challenge))
      .receive([&](std::string&) {}, [&](caf::error& e) { error = describe(e); });
  if (!error.empty()) return fail(error);
  return {};
}

std::string connect_error(const options& o, const caf::error& e, const security::credentials* creds) {
  std::string out = "fusion-admin: cannot connect to the coordinator at " + o.address + ": ";
  if (e == caf::sec::unexpected_actor_messaging_interface)
    return out + "the program listening there does not speak this build's admin protocol (is it the admin.port "
                 "of a fusion-train of the same build?)";
  if (auto why = why_not_connected(o, creds); !why.empty()) {
    out += why;
    if (why.rfind("nothing listens", 0) == 0) out += " (is fusion-train running with --admin.port=" + std::to_string(o.port) + "?)";
    return out;
  }
  out += describe_connect_error(e, creds != nullptr, "the coordinator at " + o.address);
  if (e == caf::sec::cannot_connect_to_node) out += " (is fusion-train running with --admin.port=" + std::to_string(o.port) + "?)";
  return out;
}

/// `watch [SECONDS]`: status (with the scheduler's last verdict), nodes and links, redrawn in
/// place on a terminal (plain frames one after another otherwise) until the run ends (0), the
/// coordinator stops answering (1) or Ctrl-C.
int run_watch(caf::actor_system& sys, const admin_actor& admin, const options& o) {
  const bool tty = ::isatty(STDOUT_FILENO);
  caf::scoped_actor self{sys};
  auto timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(o.timeout_s));
  for (int frame = 1;; ++frame) {
    std::string text;
    std::string failed;
    for (const char* topic : {"status", "nodes", "links"}) {
      std::string reply;
      caf::error err;
      self->request(admin, timeout, query_atom::value, std::string(topic))
          .receive([&](std::string& r) { reply = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
      if (err) {
        if (peer_gone(err) || the_watch->gone) break;
        failed = std::string(topic) + ": " + describe(err);
        break;
      }
      auto j = nlohmann::json::parse(reply, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        failed = std::string(topic) + ": the coordinator's answer is not a JSON object";
        break;
      }
      text += std::string("-- ") + topic + "\n" + admin::render(topic, j);
      if (std::string(topic) == "status" && j.value("scheduler", std::string()).empty())
        text += "scheduler  no verdict yet (the live scheduler re-plans OP-Fence cluster runs)\n";
    }
    if (the_watch->gone) {
      std::cout << "fusion-admin: " << the_watch->why() << "\n" << std::flush;
      return 0;
    }
    if (!failed.empty()) {
      std::cerr << "fusion-admin: watch: " << failed << "\n";
      return 1;
    }
    std::time_t now = std::time(nullptr);
    char clock[16];
    std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
    // Home and clear-to-end on a terminal: the frame is redrawn where it was, like top.
    std::cout << (tty ? "\33[H\33[2J" : (frame > 1 ? "\n" : "")) << "fusion-admin watch " << o.address << "  " << clock
              << "  every " << o.watch_s << " s (Ctrl-C to stop)\n"
              << text << std::flush;
    // Sleeps, but wakes at once when the coordinator goes away.
    pollfd p{the_watch->pipe_fds[0], POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(o.watch_s * 1000));
  }
}

void run_interactive(shell& sh) {
  rl_readline_name = "fusion-admin";
  rl_getc_function = admin_getc;
  rl_attempted_completion_function = complete_command;
  std::string history;
  if (const char* home = std::getenv("HOME"); home && *home) history = std::string(home) + "/.fusion_admin_history";
  if (!history.empty()) read_history(history.c_str());
  stifle_history(1000);
  for (;;) {
    char* raw = readline("fusion-admin> ");
    if (sh.gone()) {
      std::free(raw);
      break;
    }
    if (!raw) {  // Ctrl-D
      std::cout << "\n";
      break;
    }
    std::string line = raw;
    std::free(raw);
    if (line.find_first_not_of(" \t") != std::string::npos) add_history(line.c_str());
    if (!sh.run_line(line)) break;
  }
  if (!history.empty()) write_history(history.c_str());
}

int run(int argc, char** argv) {
  options o;
  if (int code = parse_args(argc, argv, o); code >= 0) return code;
  std::shared_ptr<const security::credentials> creds;
  try {
    creds = security::load_credentials(o.security, security::role::admin);
  } catch (const std::runtime_error& e) {
    std::cerr << "fusion-admin: " << e.what() << "\n";
    return 2;
  }
  if (!creds) std::cerr << security::plaintext_warning("fusion-admin") << "\n";
  caf::actor_system_config cfg;
  set_liveness(cfg, heartbeat_ms, peer_timeout_ms);
  load_network(cfg, creds.get());
  add_fusion_message_types(cfg);
  cfg.set("scheduler.max-threads", int64_t{2});
  set_scheduler_policy(cfg, "sharing");
  caf::actor_system sys{cfg};

  auto admin = connect(sys, o, creds.get());
  if (!admin) {
    std::cerr << connect_error(o, admin.error(), creds.get()) << "\n";
    return 1;
  }
  if (creds) {
    if (auto in = log_in(sys, *admin, *creds, o); !in) {
      std::cerr << "fusion-admin: " << in.error() << "\n";
      return 1;
    }
  }
  // Shared with the watcher, which may still be running when this function returns.
  auto watch = std::make_shared<coordinator_watch>();
  if (::pipe(watch->pipe_fds) != 0) throw std::runtime_error("cannot create a pipe");
  the_watch = watch.get();
  auto watcher = sys.spawn([target = *admin, w = watch](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(target);
    self->set_down_handler([=](caf::down_msg& dm) {
      // The coordinator closes its admin actor when the run ends (or is stopped) before it exits.
      bool ended = !dm.reason || dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal;
      w->set_gone(ended ? "the run ended or was stopped, and its admin shell closed" : describe(dm.reason));
      self->quit();
    });
    return {[](int32_t) {}};  // a behavior keeps the actor alive until the down message
  });

  if (o.watch) {
    int code = run_watch(sys, *admin, o);
    caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
    return code;
  }
  mode m = o.have_commands ? mode::one_shot : ::isatty(STDIN_FILENO) ? mode::interactive : mode::script;
  int code = 0;
  {
    shell sh{sys, *admin, o, m};
    if (m == mode::one_shot) {
      sh.run_line(o.commands);
    } else if (m == mode::interactive) {
      std::cerr << "connected to the coordinator at " << o.address << " ('help' lists the commands, 'quit' leaves)\n";
      run_interactive(sh);
    } else {
      std::string line;
      while (read_script_line(line) && sh.run_line(line)) {
      }
      // Stopped reading before the end of the script: the coordinator is gone. (After the last
      // command, or in -c mode, a coordinator that leaves is no failure of this shell.)
      if (!at_eof) sh.gone();
    }
    code = sh.exit_code();
  }
  caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fusion-admin: error: " << e.what() << "\n";
    return 1;
  }
}
