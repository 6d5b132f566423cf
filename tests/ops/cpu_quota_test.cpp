// ops/cpu_quota: the cgroup CPU quota the CPU backend times ops with, read from files laid out
// as cgroup v1 and v2 mount them (a temporary directory stands in for /sys/fs/cgroup).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

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
