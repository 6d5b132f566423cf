// fusion-admin against real processes: a fusion-train run with its admin shell on a free port,
// queried with -c, with --json, from a script on stdin; a coordinator killed under a waiting
// shell. Every wait is bounded, so a coordinator without an admin shell fails these tests in
// seconds with its output, never a hang.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/certs_fixture.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

namespace {

using fusion::test::child_process;
using nlohmann::json;

std::string bin(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

/// A port nobody listens on right now: bound to port 0, then released.
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct admin_result {
  int status = -2;  // -2: still running after the timeout (then killed)
  std::string output;
};

/// Runs fusion-admin to the end (at most `timeout_s`), stdout and stderr merged.
admin_result run_admin(std::vector<std::string> args, const std::string& tag, double timeout_s = 10) {
  args.insert(args.begin(), bin("fusion-admin"));
  args.push_back(fusion::test::certs_arg());
  auto log = fusion::test::temp_path("admin", tag + ".log");
  admin_result r;
  {
    child_process p(args, log);
    r.status = p.wait(timeout_s);
    r.output = p.output();
  }
  std::filesystem::remove(log);  // the output is in the result (and in INFO when a check fails)
  return r;
}

/// Same, with stdin read from `input_file` (a script: not a terminal).
child_process start_admin_on(const std::string& address, const std::string& input_file, const std::string& tag) {
  std::string cmd = "exec '" + bin("fusion-admin") + "' " + address + " --timeout 5 " + fusion::test::certs_arg() +
                    " < '" + input_file + "'";
  return child_process({"/bin/sh", "-c", cmd}, fusion::test::temp_path("admin", tag + ".log"));
}

/// The first line of `text` that is a JSON object.
json first_json(const std::string& text) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] == '{') return json::parse(l, nullptr, false);
  return json();
}

/// No CAF type names or enum spellings reach the user.
void check_plain_words(const std::string& out) {
  for (const char* word : {"caf::", "sec::", "bad_command", "remote_link_unreachable", "request_receiver_down",
                           "exit_reason", "error("})
    CHECK_MESSAGE(out.find(word) == std::string::npos, "'" << word << "' in: " << out);
}

/// A fusion-train run of gpt-char-tiny with the admin shell on a free port; killed (SIGKILL)
/// when it goes out of scope. Outputs (metrics, checkpoint, sample) are off. 1000 steps last
/// about 30 s on an idle 2-core box, so the run outlives the queries even on a loaded one.
struct coordinator {
  uint16_t port = free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  child_process proc;

  explicit coordinator(const std::string& tag)
      : proc({bin("fusion-train"), "--config", "configs/runs/char-tiny.ini", "--admin.port=" + std::to_string(port),
              "--train.steps=1000", "--train.eval-every=0", "--train.eval-batches=0", "--output.metrics=",
              "--output.checkpoint=", "--output.sample-chars=0", fusion::test::certs_arg()},
             fusion::test::temp_path("admin", tag + "_train.log"), FUSION_SOURCE_DIR) {}

  /// Waits (at most 20 s) for "admin shell listening"; fails at once if fusion-train exits first.
  void wait_listening() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (proc.output().find("admin shell listening on") == std::string::npos) {
      int st = proc.wait(0.1);
      if (st != -2) FAIL("fusion-train exited (status " << st << ") before its admin shell listened:\n" << proc.output());
      if (std::chrono::steady_clock::now() > deadline)
        FAIL("no 'admin shell listening' line from fusion-train within 20 s:\n" << proc.output());
    }
    CHECK(proc.output().find("admin shell listening on 127.0.0.1:" + std::to_string(port)) != std::string::npos);
  }

  /// status --json once the run is training with a step done (at most 20 s).
  json wait_training() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      auto r = run_admin({address, "-c", "status", "--json", "--timeout", "5"}, "status");
      INFO(r.output);
      REQUIRE(r.status == 0);
      auto s = first_json(r.output);
      REQUIRE(s.is_object());
      if (s.value("phase", "") == "training" && s.value("step", int64_t{0}) >= 1) return s;
      if (std::chrono::steady_clock::now() > deadline) FAIL("the run is not training after 20 s: " << s.dump());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
};

/// A FIFO as the shell's stdin: not a terminal, and open until the test closes it, so the shell
/// waits for more commands in between.
int make_fifo(const std::string& path) {
  ::unlink(path.c_str());
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);  // read-write: opening never blocks
  REQUIRE(fd >= 0);
  return fd;
}

/// fusion-admin reading a script from a FIFO the test writes to.
struct piped_shell {
  std::string fifo;
  int fd;
  child_process proc;

  piped_shell(const std::string& address, const std::string& tag)
      : fifo(fusion::test::temp_path("admin", tag + ".fifo")), fd(make_fifo(fifo)),
        proc(start_admin_on(address, fifo, tag)) {}
  ~piped_shell() {
    close_input();
    ::unlink(fifo.c_str());
  }
  void send(const std::string& line) {
    std::string text = line + "\n";
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  }
  void close_input() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  /// Waits (at most 10 s, less if the shell exits) until `n` status tables are out.
  bool wait_replies(size_t n) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto out = proc.output();
      size_t count = 0;
      for (auto at = out.find("phase "); at != std::string::npos; at = out.find("phase ", at + 1)) ++count;
      if (count >= n) return true;
      if (proc.wait(0.1) != -2 || std::chrono::steady_clock::now() > deadline) return false;
    }
  }
};

}  // namespace

TEST_CASE("apps/fusion-admin: usage mistakes exit 2 and say what is wrong") {
  auto r = run_admin({"--help"}, "help");
  CHECK(r.status == 0);
  CHECK(r.output.find("HOST:PORT") != std::string::npos);
  CHECK(run_admin({"--version"}, "version").status == 0);
  r = run_admin({}, "noaddr");
  CHECK(r.status == 2);
  CHECK(r.output.find("no coordinator address") != std::string::npos);
  r = run_admin({"127.0.0.1:1", "--jsn"}, "badopt");
  CHECK(r.status == 2);
  CHECK(r.output.find("did you mean '--json'?") != std::string::npos);
  r = run_admin({"localhost"}, "badaddr");
  CHECK(r.status == 2);
  CHECK(r.output.find("HOST:PORT") != std::string::npos);
  r = run_admin({"127.0.0.1:7", "--timeout", "soon"}, "badtimeout");
  CHECK(r.status == 2);
  CHECK(r.output.find("--timeout") != std::string::npos);
}

TEST_CASE("apps/fusion-admin: an address nobody listens on gives a clear error and exit 1") {
  auto address = "127.0.0.1:" + std::to_string(free_port());
  auto r = run_admin({address, "-c", "status", "--timeout", "5"}, "noconnect");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("cannot connect to the coordinator at " + address) != std::string::npos);
  check_plain_words(r.output);
  // An IPv6 literal in brackets is an address like any other, not a host name to resolve.
  const auto v6 = "[::1]:" + std::to_string(free_port());
  r = run_admin({v6, "-c", "status", "--timeout", "5"}, "noconnect6");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("nothing listens on " + v6 + " (connection refused)") != std::string::npos);
  r = run_admin({"::1:7700", "-c", "status"}, "unbracketed6");
  CHECK(r.status == 2);
  CHECK(r.output.find("an IPv6 address takes brackets before its port, e.g. [::1]:7700") != std::string::npos);
}

// CAF says "cannot connect" alike for all three; the shell tells them apart (apps/peer_check.cpp).
TEST_CASE("apps/fusion-admin: a failed connection says why: nothing listens, no TLS, a TLS peer of another CA") {
  auto address = "127.0.0.1:" + std::to_string(free_port());
  auto refused = run_admin({address, "-c", "status", "--timeout", "5"}, "refused");
  INFO(refused.output);
  CHECK(refused.status == 1);
  CHECK(refused.output.find("nothing listens on " + address + " (connection refused)") != std::string::npos);
  // A plaintext service: fusion-probe's data channel server without certificates.
  auto serve = [](std::vector<std::string> extra, const std::string& tag) {
    std::vector<std::string> args = {bin("fusion-probe"), "serve", "--host", "127.0.0.1"};
    args.insert(args.end(), extra.begin(), extra.end());
    child_process p(args, fusion::test::temp_path("admin", tag + ".log"));
    std::string out;
    for (int i = 0; i < 100 && (out = p.output()).find("port=") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE_MESSAGE(out.find("port=") != std::string::npos, out);
    const std::string port = out.substr(out.find("port=") + 5, out.find('\n', out.find("port=")) - out.find("port=") - 5);
    return std::pair{std::move(p), "127.0.0.1:" + port};
  };
  {
    auto [server, at] = serve({}, "plain-server");
    auto r = run_admin({at, "-c", "status", "--timeout", "5"}, "not-tls");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("the program at " + at + " answers, but does not speak TLS") != std::string::npos);
    CHECK(r.output.find("nothing listens") == std::string::npos);
  }
  // A TLS peer whose certificate another CA signed.
  auto other = fusion::test::temp_path("admin", "peer-ca");
  std::filesystem::remove_all(other);
  fusion::security::make_cluster_certs(other, {"a1"});
  {
    auto [server, at] = serve({"--security.certs", other, "--node.name", "a1"}, "tls-server");
    auto r = run_admin({at, "-c", "status", "--timeout", "5"}, "other-ca");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("the TLS peer at " + at + " holds a certificate that the CA " + fusion::test::certs_dir() +
                        "/ca.pem did not sign") != std::string::npos);
  }
  std::filesystem::remove_all(other);
}

TEST_CASE("apps/fusion-admin: queries a live run: status advances, nodes, placement, ops, links, errors") {
  coordinator c("live");
  c.wait_listening();
  auto s1 = c.wait_training();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto r = run_admin({c.address, "-c", "status", "--json"}, "status2");
  INFO(r.output);
  REQUIRE(r.status == 0);
  auto s2 = first_json(r.output);
  REQUIRE(s2.is_object());
  CHECK(s2.value("phase", "") == "training");
  CHECK(s2.value("step", int64_t{0}) > s1.value("step", int64_t{0}));
  CHECK(s2.value("steps", int64_t{0}) == 1000);

  // Several commands in one -c, one JSON object per line, in order.
  r = run_admin({c.address, "-c", "nodes; placement; ops; links", "--json"}, "json4");
  REQUIRE(r.status == 0);
  std::vector<json> replies;
  std::istringstream in(r.output);
  for (std::string l; std::getline(in, l);) replies.push_back(json::parse(l, nullptr, false));
  REQUIRE(replies.size() == 4);
  auto& nodes = replies[0]["nodes"];
  REQUIRE(nodes.is_array());
  REQUIRE(nodes.size() >= 1);
  CHECK(!nodes[0].value("name", "").empty());
  CHECK(nodes[0].value("device", "") == "cpu");
  auto& ops = replies[1]["ops"];
  REQUIRE(ops.is_array());
  CHECK(ops.size() > 5);
  CHECK(!ops[0].value("op", "").empty());
  CHECK(replies[1]["edges"].is_array());
  REQUIRE(replies[2]["ops"].is_array());
  CHECK(replies[2]["ops"].size() > 5);
  CHECK(replies[2]["ops"][0].value("fwd_ms", -1.0) >= 0);
  CHECK(replies[3]["edges"].is_array());  // one process: no cross-process edges, but an answer

  // The tables.
  r = run_admin({c.address, "-c", "status; nodes; placement; ops"}, "tables");
  CHECK(r.status == 0);
  for (const char* s : {"phase", "training", "ETA", "GFLOP/s", "memory GiB", "policy:", "fwd ms"})
    CHECK_MESSAGE(r.output.find(s) != std::string::npos, "'" << s << "' missing");

  // An unknown command: nothing is sent, exit 1, a suggestion.
  r = run_admin({c.address, "-c", "nodez"}, "unknown");
  CHECK(r.status == 1);
  CHECK(r.output.find("unknown command 'nodez'") != std::string::npos);
  CHECK(r.output.find("did you mean 'nodes'?") != std::string::npos);
  // A verb the coordinator refuses (no such op): its error in plain words, exit 1.
  r = run_admin({c.address, "-c", "move no_such_op no_such_node"}, "refused");
  CHECK(r.status == 1);
  CHECK(r.output.find("move: this run has no cluster") != std::string::npos);
  check_plain_words(r.output);

  // Scripts on stdin: comments are skipped; a bad line is reported with its number, exit 1.
  auto script = fusion::test::temp_path("admin", "script.txt");
  std::ofstream(script) << "status\n# the nodes next\nnodes\n";
  auto p = start_admin_on(c.address, script, "script_ok");
  CHECK(p.wait(10) == 0);
  CHECK(p.output().find("GFLOP/s") != std::string::npos);
  std::ofstream(script) << "status\nnodez\n";
  auto q = start_admin_on(c.address, script, "script_bad");
  CHECK(q.wait(10) == 1);
  CHECK(q.output().find("line 2") != std::string::npos);
}

TEST_CASE("apps/fusion-admin: an idle shell stays connected longer than the peer timeout") {
  coordinator c("idle");
  c.wait_listening();
  piped_shell shell(c.address, "idle");
  shell.send("status");
  REQUIRE(shell.wait_replies(1));
  // fusion-admin declares a peer dead after 2 s without traffic (heartbeats both ways), so the
  // coordinator must send heartbeats to a connected shell even in a one-process run.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  INFO(shell.proc.output());
  REQUIRE_MESSAGE(shell.proc.wait(0) == -2, "the shell lost a live coordinator while idle: does fusion-train "
                                              "set heartbeats (set_liveness) whenever admin.port is set?");
  shell.send("status");
  CHECK(shell.wait_replies(2));
  shell.close_input();  // end of the script: exit 0
  CHECK(shell.proc.wait(5) == 0);
}

TEST_CASE("apps/fusion-admin: a coordinator killed under a waiting shell ends it with exit 1, 'went away'") {
  coordinator c("kill");
  c.wait_listening();
  piped_shell shell(c.address, "waiting");
  shell.send("status");
  INFO(shell.proc.output());
  REQUIRE(shell.wait_replies(1));
  REQUIRE(shell.proc.wait(0) == -2);  // still waiting for its next command

  c.proc.signal(SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  int st = shell.proc.wait(5);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  INFO(shell.proc.output());
  CHECK(st == 1);
  CHECK(took < 5);
  CHECK(shell.proc.output().find("fusion-admin: the coordinator at " + c.address + " went away") !=
        std::string::npos);
  check_plain_words(shell.proc.output());
}

TEST_CASE("apps/fusion-admin: a node certificate, a plaintext shell or a foreign CA cannot administer the run") {
  coordinator c("roles");
  c.wait_listening();
  const auto certs = fusion::test::certs_dir();
  // Explicit files override the directory that run_admin passes (--security.certs, appended last).
  auto as_node = run_admin({c.address, "-c", "status", "--security.certificate=" + certs + "/nodes/n0.pem",
                            "--security.key=" + certs + "/nodes/n0.key"},
                           "role-node");
  INFO(as_node.output);
  // The shell itself refuses to present a node's certificate as the admin's (the coordinator would
  // refuse it too: tests/security/admission_test.cpp).
  CHECK(as_node.status == 2);
  CHECK(as_node.output.find("n0.pem belongs to node 'n0', not to admin") != std::string::npos);
  auto plain = run_admin({c.address, "-c", "status", "--security.mode", "off"}, "role-plain");
  INFO(plain.output);
  CHECK(plain.status == 1);
  CHECK(plain.output.find("WARNING: security.mode=off") != std::string::npos);
  CHECK(plain.output.find("sends nothing to this plaintext client: it may require TLS") != std::string::npos);
  check_plain_words(plain.output);
  auto other = fusion::test::temp_path("admin", "other-ca");
  std::filesystem::remove_all(other);
  fusion::security::make_cluster_certs(other, {});
  auto foreign = run_admin({c.address, "-c", "status", "--security.ca=" + other + "/ca.pem",
                            "--security.certificate=" + other + "/admin.pem", "--security.key=" + other + "/admin.key"},
                           "role-foreign");
  INFO(foreign.output);
  CHECK(foreign.status == 1);
  CHECK(foreign.output.find("the TLS peer at " + c.address + " holds a certificate that the CA " + other +
                            "/ca.pem did not sign") != std::string::npos);
  std::filesystem::remove_all(other);
  // The admin certificate still works after the refusals.
  CHECK(run_admin({c.address, "-c", "status"}, "role-admin").status == 0);
}
