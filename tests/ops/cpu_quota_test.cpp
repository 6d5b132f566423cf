// ops/cpu_quota: the cgroup CPU quota the CPU backend times ops with, read from files laid out
// as cgroup v1 and v2 mount them (a temporary directory stands in for /sys/fs/cgroup).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ops/backend.hpp"
#include "ops/cpu_quota.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;

namespace {

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

}  // namespace

TEST_CASE("cpu quota: cgroup v1 and v2 file contents give cores and the period, no quota gives none") {
  CHECK(cfs_quota("30000", "100000").cores == doctest::Approx(0.3));
  CHECK(cfs_quota("30000", "100000").period_s == doctest::Approx(0.1));
  CHECK(cfs_quota("30000", "100000").binds());
  CHECK(cfs_quota("250000", "100000").cores == doctest::Approx(2.5));
  CHECK_FALSE(cfs_quota("250000", "100000").binds());
  CHECK(cfs_quota("-1", "100000").cores == 0);
  CHECK_FALSE(cfs_quota("-1", "100000").binds());
  CHECK(cfs_quota("", "100000").cores == 0);
  CHECK(cfs_quota("30000", "0").cores == 0);
  CHECK(cpu_max_quota("30000 50000").cores == doctest::Approx(0.6));
  CHECK(cpu_max_quota("30000 50000").period_s == doctest::Approx(0.05));
  CHECK(cpu_max_quota("max 100000").cores == 0);
  CHECK(cpu_max_quota("garbage").cores == 0);
}

TEST_CASE("cpu quota: /proc/self/cgroup names the cpu controller's cgroup in either hierarchy") {
  const auto v1 = parse_proc_cgroup("4:memory:/m\n3:cpu,cpuacct:/fusion-geo-a1\n0::/user.slice\n");
  CHECK(v1.v1 == "/fusion-geo-a1");
  CHECK(v1.v2 == "/user.slice");
  const auto split = parse_proc_cgroup("2:cpuacct:/x\n1:cpu:/y\n");
  CHECK(split.v1 == "/y");
  CHECK(split.v2.empty());
  const auto v2 = parse_proc_cgroup("0::/fusion-geo-b2\n");
  CHECK(v2.v1.empty());
  CHECK(v2.v2 == "/fusion-geo-b2");
  CHECK(parse_proc_cgroup("not a cgroup line\n").v1.empty());
}

TEST_CASE("cpu quota: the smallest quota of the cgroup and its ancestors applies") {
  fusion::test::scratch_dir root("quota", "root");
  const auto r = root.path;
  // v1: the node's cgroup has 0.3 cores under a parent of 2 and the root's "no quota".
  write(r / "cpu/cpu.cfs_quota_us", "-1");
  write(r / "cpu/cpu.cfs_period_us", "100000");
  write(r / "cpu/site/cpu.cfs_quota_us", "200000");
  write(r / "cpu/site/cpu.cfs_period_us", "100000");
  write(r / "cpu/site/node/cpu.cfs_quota_us", "30000");
  write(r / "cpu/site/node/cpu.cfs_period_us", "100000");
  CHECK(cgroup_quota({"/site/node", ""}, r.string()).cores == doctest::Approx(0.3));
  CHECK(cgroup_quota({"/site", ""}, r.string()).cores == doctest::Approx(2.0));
  CHECK(cgroup_quota({"/", ""}, r.string()).cores == 0);
  CHECK(cgroup_quota({"/missing", ""}, r.string()).cores == 0);
  // v2 (here under "unified", as a hybrid system mounts it): a parent's cap is the tighter one,
  // and its period comes with it.
  write(r / "unified/a/cpu.max", "25000 50000");
  write(r / "unified/a/b/cpu.max", "max 100000");
  CHECK(cgroup_quota({"", "/a/b"}, r.string()).cores == doctest::Approx(0.5));
  CHECK(cgroup_quota({"", "/a/b"}, r.string()).period_s == doctest::Approx(0.05));
  CHECK(cgroup_quota({"/site/node", "/a/b"}, r.string()).cores == doctest::Approx(0.3));
  CHECK(cgroup_quota({"/site/node", "/a/b"}, r.string()).period_s == doctest::Approx(0.1));
  CHECK(cgroup_quota({}, r.string()).cores == 0);
}

TEST_CASE("cpu quota: without a quota the CPU backend's op times are wall times") {
  // Without a quota (the test machine's case, usually) a timed busy span is its wall time.
  auto b = make_backend("cpu");
  b->begin_timing(0);
  volatile double x = 1;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) x = x * 1.0000001 + 1e-9;
  b->end_timing(0);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!process_cpu_quota().binds()) {
    CHECK(b->timed_seconds(0) >= 0.019);
    CHECK(b->timed_seconds(0) <= wall + 1e-3);
  }
  CHECK(b->timed_seconds(7) == 0);
}

TEST_CASE("cpu quota: under a real cgroup quota an op's time is its CPU time, not its paused wall time") {
  // A child process joins a fresh cgroup capped at 0.2 core and times a busy loop of 60 ms of
  // CPU: the quota pauses it for at least two periods (wall >= 60 ms / 0.2 - 2 x 100 ms = 100 ms),
  // and the backend must report the 60 ms it ran. Needs root and a cgroup cpu controller (v1
  // /sys/fs/cgroup/cpu or v2 with cpu); skipped otherwise.
  namespace fs = std::filesystem;
  const bool v2 = fs::exists("/sys/fs/cgroup/cgroup.controllers");
  const fs::path dir = v2 ? fs::path("/sys/fs/cgroup") : fs::path("/sys/fs/cgroup/cpu");
  const fs::path cg = dir / ("fusion-quota-test-" + std::to_string(::getpid()));
  std::error_code ec;
  if (::geteuid() != 0 || !fs::create_directory(cg, ec)) {
    MESSAGE("skipped: cannot make a cgroup under " << dir.string() << " (needs root and a cpu controller)");
    return;
  }
  bool capped = false;
  if (v2) {
    capped = static_cast<bool>(std::ofstream(cg / "cpu.max") << "20000 100000\n");
  } else {
    std::ofstream(cg / "cpu.cfs_period_us") << "100000\n";
    capped = static_cast<bool>(std::ofstream(cg / "cpu.cfs_quota_us") << "20000\n");
  }
  const pid_t child = capped ? ::fork() : -1;
  if (child == 0) {
    int code = 1;
    if (std::ofstream(cg / "cgroup.procs") << ::getpid() << "\n") {
      // The quota is re-read at most once a second: let the value cached before the fork expire.
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
      auto b = make_backend("cpu");
      auto cpu_now = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec + ts.tv_nsec * 1e-9;
      };
      volatile double x = 1;
      const auto w0 = std::chrono::steady_clock::now();
      b->begin_timing(0);
      const double c0 = cpu_now();
      while (cpu_now() - c0 < 0.06) x = x * 1.0000001 + 1e-9;
      const double spent = cpu_now() - c0;
      b->end_timing(0);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      const cpu_quota quota = process_cpu_quota();
      const double timed = b->timed_seconds(0);
      std::fprintf(stderr, "quota %.3f cores per %.3f s, cpu %.4f s, wall %.4f s, timed %.4f s\n", quota.cores,
                   quota.period_s, spent, wall, timed);
      code = quota.cores > 0.19 && quota.cores < 0.21 && quota.period_s > 0.099 && quota.period_s < 0.101 &&
                     wall >= 0.1 && timed >= spent - 1e-3 && timed <= spent * 1.1 + 1e-3
                 ? 0
                 : 2;
    }
    std::_Exit(code);
  }
  int status = -1;
  if (child > 0) ::waitpid(child, &status, 0);
  fs::remove(cg, ec);  // empty again once the child has exited
  REQUIRE_MESSAGE(capped, "could not set a quota on " << cg.string());
  REQUIRE(child > 0);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0),
                "the child saw the wrong quota or time (its line above); status " << status);
}
