// The CPU quota a cgroup puts on this process (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us,
// cgroup v2 cpu.max). A process under a CFS quota of q cores runs at full speed until the
// period's quota (q x period of CPU time) is spent, and is then paused until the next period.
// So on a node capped below one core the CPU backend times an op by its thread CPU time (what it
// takes at full speed), and the workload estimator runs the node's ops at that speed under a
// budget of q x period per period (docs/scheduler.md, "Nodes under a CPU quota"). Wall time
// would depend on when the period's pause falls. Plain C++; the parsers take file contents and
// are tested directly.
#pragma once

#include <string>

namespace fusion {

/// A CFS bandwidth limit: `cores` of CPU time per wall second, granted per `period_s`.
struct cpu_quota {
  double cores = 0;     ///< quota / period; 0: no quota
  double period_s = 0;  ///< the CFS period (0.1 s unless the cgroup says otherwise); 0 with no quota

  /// Whether the quota holds one thread back: below one core. A serial op runner under a quota
  /// of a core or more never waits for its budget.
  bool binds() const { return cores > 0 && cores < 1; }
  bool operator==(const cpu_quota&) const = default;
};

/// The quota of cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us contents; none (cores 0) for
/// no quota ("-1") or text that is not a number.
cpu_quota cfs_quota(const std::string& quota_us, const std::string& period_us);

/// The quota of cgroup v2's cpu.max contents ("30000 100000" -> 0.3 cores per 0.1 s); none for
/// "max ...".
cpu_quota cpu_max_quota(const std::string& cpu_max);

/// The cpu controller's cgroup of a process, from its /proc/PID/cgroup text.
struct cgroup_cpu_paths {
  std::string v1;  ///< path in the v1 hierarchy that has the "cpu" controller ("" when none)
  std::string v2;  ///< path in the v2 (unified) hierarchy ("" when none)
};

/// Parses /proc/self/cgroup lines "ID:CONTROLLERS:PATH".
cgroup_cpu_paths parse_proc_cgroup(const std::string& text);

/// The smallest quota of the cgroup and its ancestors under `root` (where the hierarchies are
/// mounted: ROOT/cpu or ROOT/cpu,cpuacct for v1, ROOT or ROOT/unified for v2); none when none
/// applies or nothing can be read.
cpu_quota cgroup_quota(const cgroup_cpu_paths& paths, const std::string& root = "/sys/fs/cgroup");

/// This process's quota (none: cores 0), read again at most once a second, so that a cap put on
/// a running node is seen. Thread-safe.
cpu_quota process_cpu_quota();

/// CPU seconds this process has used (user and system, every thread): what a quota counts.
double process_cpu_seconds();

}  // namespace fusion
