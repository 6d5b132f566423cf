// fusion-train's Prometheus endpoint (metrics.port; docs/training.md, "Live metrics") read with
// curl during a run, as a scraper would: text format 0.0.4, HELP and TYPE per gauge, the step
// advancing between two scrapes.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

namespace {

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

long step_of(const std::string& text) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(R"(\nfusion_step (\d+)\n)")) ? std::stol(m[1]) : -1;
}

}  // namespace

TEST_CASE("prometheus: curl reads the live figures of a run in Prometheus' text format") {
  if (std::system("command -v curl >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: curl is not installed (scripts/setup.sh installs it)");
    return;
  }
  fusion::test::scratch_dir dir("prometheus", "run");
  const uint16_t port = free_port();
  fusion::test::child_process run(
      {std::string(FUSION_BINARY_DIR) + "/apps/fusion-train", "--config", fusion::test::src("configs/runs/char-tiny.ini"),
       "--metrics.port=" + std::to_string(port), "--train.steps=100000", "--train.eval-batches=0",
       "--output.metrics=", "--output.checkpoint=", "--output.sample-chars=0", "--runtime.quiet"},
      (dir / "train.log").string(), dir.path.string());
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  auto scrape = [&] { return fusion::test::run_in(dir.path.string(), "curl -s -i --max-time 5 " + url).output; };
  std::string first;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (step_of(first) < 1) {
    REQUIRE_MESSAGE(run.wait(0.2) == -2, "fusion-train exited:\n" << run.output());
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "no step scraped within 60 s:\n" << first);
    first = scrape();
  }
  INFO(run.output() << "\nfirst scrape:\n" << first);
  CHECK(run.output().find("fusion-train: Prometheus metrics at " + url) != std::string::npos);
  CHECK(first.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(first.find("# TYPE fusion_loss gauge\nfusion_loss ") != std::string::npos);
  CHECK(first.find("fusion_items_per_second{items=\"tokens\"} ") != std::string::npos);
  CHECK(first.find("fusion_run_info{model=\"gpt-char-tiny\",items=\"tokens\"} 1") != std::string::npos);
  CHECK(first.find("fusion_steps_target 100000") != std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string second = scrape();
  INFO("second scrape:\n" << second);
  CHECK(step_of(second) > step_of(first));
  // Every sample line is NAME[{labels}] VALUE with a number.
  std::istringstream lines(second.substr(second.find("\r\n\r\n") + 4));
  for (std::string l; std::getline(lines, l);)
    if (!l.empty() && l[0] != '#')
      CHECK_MESSAGE(std::regex_match(l, std::regex(R"(fusion_[a-z_]+(\{[^}]*\})? -?[0-9.eE+-]+)")), l);
}

TEST_CASE("prometheus: a metrics.port in use is a usage error before anything loads") {
  fusion::test::scratch_dir dir("prometheus", "busy");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  auto r = fusion::test::run_in(dir.path.string(), std::string(FUSION_BINARY_DIR) + "/apps/fusion-train --config " +
                                                       fusion::test::src("configs/runs/char-tiny.ini") +
                                                       " --metrics.port=" + port + " --output.metrics= --output.checkpoint=");
  ::close(fd);
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("cannot serve metrics on 127.0.0.1:" + port + " (metrics.port)") != std::string::npos);
}
