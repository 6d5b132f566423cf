// The admin shell as a user meets it in a one-process run (docs/admin.md): fusion-train given
// --admin.port and no certificates makes its own (loopback only) in the run's directory and
// prints the exact fusion-admin command, which works as printed; `fusion-admin ... watch`
// redraws status, nodes and links in place on a terminal (tmux) and prints plain frames into a
// file.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

namespace {

namespace fs = std::filesystem;
using fusion::test::child_process;
using fusion::test::run_in;

std::string bin(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

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

// Every "step N/" in `text`, in order.
std::vector<long> steps_in(const std::string& text) {
  std::vector<long> out;
  std::regex re(R"(step +(\d+)/)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.push_back(std::stol((*it)[1]));
  return out;
}

// A long gpt-char-tiny run with its admin shell on `port` and no certificates, writing into `dir`.
struct run_without_certs {
  fusion::test::scratch_dir dir;
  uint16_t port = free_port();
  child_process proc;
  std::string command;  // the fusion-admin command it printed

  run_without_certs()
      : dir("watch", "run"),
        proc({bin("fusion-train"), "--config", fusion::test::src("configs/runs/char-tiny.ini"),
              "--admin.port=" + std::to_string(port), "--train.steps=100000", "--train.eval-batches=0",
              "--output.metrics=run/m.jsonl", "--output.checkpoint=", "--output.sample-chars=0"},
             (dir / "train.log").string(), dir.path.string()) {
    const std::string says = "fusion-train: attach the admin shell with: ";
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      std::string out = proc.output();
      if (auto at = out.find(says); at != std::string::npos && out.find('\n', at) != std::string::npos) {
        command = out.substr(at + says.size(), out.find('\n', at) - at - says.size());
        break;
      }
      int st = proc.wait(0.1);
      if (st != -2) FAIL("fusion-train exited (status " << st << ") before its admin shell listened:\n" << out);
      if (std::chrono::steady_clock::now() > deadline) FAIL("no admin command printed within 60 s:\n" << out);
    }
  }
};

}  // namespace

TEST_CASE("admin watch: a run without certificates makes its own and prints a command that works as printed") {
  run_without_certs run;
  INFO(run.proc.output());
  CHECK(run.proc.output().find("fusion-train: no security.certs given: the admin shell uses certificates made for this "
                               "run in run/admin-certs and listens on loopback only") != std::string::npos);
  CHECK(run.command == bin("fusion-admin") + " 127.0.0.1:" + std::to_string(run.port) +
                           " --security.certs=run/admin-certs");
  CHECK(fs::exists(run.dir / "run/admin-certs/admin.pem"));
  // Copied as printed, from the directory the run was started in.
  auto r = run_in(run.dir.path.string(), run.command + " -c status --json");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("\"phase\"") != std::string::npos);

  // Not a terminal: plain frames one after the other, the step advancing, no escape codes.
  r = run_in(run.dir.path.string(), "timeout -s INT 4 " + run.command + " watch 0.5; true");
  INFO(r.output);
  auto steps = steps_in(r.output);
  REQUIRE(steps.size() >= 2);
  CHECK(steps.back() > steps.front());
  CHECK(r.output.find("-- nodes") != std::string::npos);
  CHECK(r.output.find("-- links") != std::string::npos);
  CHECK(r.output.find("\33[") == std::string::npos);
}

TEST_CASE("admin watch: under tmux the frame is redrawn in place and the step advances") {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: tmux is not installed (scripts/setup.sh installs it)");
    return;
  }
  run_without_certs run;
  const std::string session = "fusion_watch_" + std::to_string(::getpid());
  auto sh = [&](const std::string& cmd) { return run_in(run.dir.path.string(), cmd); };
  auto r = sh("tmux new-session -d -s " + session + " -x 120 -y 50 '" + run.command + " watch 0.5'");
  REQUIRE(r.status == 0);
  auto capture = [&] { return sh("tmux capture-pane -p -t " + session).output; };
  std::string first;
  for (int i = 0; i < 100 && steps_in(first).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    first = capture();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  std::string second = capture();
  sh("tmux kill-session -t " + session);
  INFO("first:\n" << first << "\nsecond:\n" << second);
  auto a = steps_in(first), b = steps_in(second);
  REQUIRE(a.size() == 1);  // one frame on the screen: redrawn in place, not scrolled
  REQUIRE(b.size() == 1);
  CHECK(b[0] > a[0]);
  CHECK(second.rfind("fusion-admin watch 127.0.0.1:", 0) == 0);  // the frame starts at the top
}

TEST_CASE("admin watch: without certificates an admin shell off loopback is refused") {
  fusion::test::scratch_dir dir("watch", "host");
  auto r = run_in(dir.path.string(), bin("fusion-train") + " --config " + fusion::test::src("configs/runs/char-tiny.ini") +
                                         " --admin.port=7999 --admin.host=0.0.0.0 --output.metrics= --output.checkpoint=");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("admin.host is 0.0.0.0, not a loopback address") != std::string::npos);
  r = run_in(dir.path.string(), bin("fusion-admin") + " 127.0.0.1:7999 watch 0");
  CHECK(r.status == 2);
  CHECK(r.output.find("watch 0: expected seconds between redraws") != std::string::npos);
}
