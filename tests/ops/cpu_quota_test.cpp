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

TEST_CASE("cpu quota: cgroup v1 and v2 file contents give cores, no quota gives 0") {
  CHECK(cfs_quota_cores("30000", "100000") == doctest::Approx(0.3));
  CHECK(cfs_quota_cores("250000", "100000") == doctest::Approx(2.5));
  CHECK(cfs_quota_cores("-1", "100000") == 0);
  CHECK(cfs_quota_cores("", "100000") == 0);
  CHECK(cfs_quota_cores("30000", "0") == 0);
  CHECK(cpu_max_cores("30000 100000") == doctest::Approx(0.3));
  CHECK(cpu_max_cores("max 100000") == 0);
  CHECK(cpu_max_cores("garbage") == 0);
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
  CHECK(cgroup_quota_cores({"/site/node", ""}, r.string()) == doctest::Approx(0.3));
  CHECK(cgroup_quota_cores({"/site", ""}, r.string()) == doctest::Approx(2.0));
  CHECK(cgroup_quota_cores({"/", ""}, r.string()) == 0);
  CHECK(cgroup_quota_cores({"/missing", ""}, r.string()) == 0);
  // v2 (here under "unified", as a hybrid system mounts it): a parent's cap is the tighter one.
  write(r / "unified/a/cpu.max", "50000 100000");
  write(r / "unified/a/b/cpu.max", "max 100000");
  CHECK(cgroup_quota_cores({"", "/a/b"}, r.string()) == doctest::Approx(0.5));
  CHECK(cgroup_quota_cores({"/site/node", "/a/b"}, r.string()) == doctest::Approx(0.3));
  CHECK(cgroup_quota_cores({}, r.string()) == 0);
}

TEST_CASE("cpu quota: the CPU backend's op times are at least the wall time") {
  // Without a quota (the test machine's case, usually) a timed busy span is its wall time; with
  // one, the CPU time over the quota may only make it longer.
  auto b = make_backend("cpu");
  b->begin_timing(0);
  volatile double x = 1;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) x = x * 1.0000001 + 1e-9;
  b->end_timing(0);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(b->timed_seconds(0) >= 0.019);
  if (process_cpu_quota_cores() == 0) CHECK(b->timed_seconds(0) <= wall + 1e-3);
  CHECK(b->timed_seconds(7) == 0);
}

TEST_CASE("cpu quota: under a real cgroup quota an op's time is its CPU time over the quota") {
  // A child process joins a fresh cgroup capped at 0.2 core and times a busy loop of 5 ms of
  // CPU: whatever the wall time, the backend must report at least 5 ms / 0.2 = 25 ms. Needs root
  // and a cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 with cpu); skipped otherwise.
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
      b->begin_timing(0);
      const double c0 = cpu_now();
      while (cpu_now() - c0 < 0.005) x = x * 1.0000001 + 1e-9;
      const double spent = cpu_now() - c0;
      b->end_timing(0);
      const double quota = process_cpu_quota_cores(), timed = b->timed_seconds(0);
      std::fprintf(stderr, "quota %.3f cores, cpu %.4f s, timed %.4f s\n", quota, spent, timed);
      code = quota > 0.19 && quota < 0.21 && timed >= 4.5 * spent ? 0 : 2;
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
