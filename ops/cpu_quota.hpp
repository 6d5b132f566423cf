// The CPU quota a cgroup puts on this process (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us,
// cgroup v2 cpu.max), in cores. The CPU backend times ops with it: a process under a CFS quota
// runs at full speed until the period's quota is spent and is then paused, so the wall time of a
// short op depends on how busy the node was before it (a lightly loaded capped node looks as
// fast as an uncapped one), while its CPU time over the quota is what it costs the node's budget
// (docs/scheduler.md, "What the runtime measures"). Plain C++; the parsers take file contents
// and are tested directly.
#pragma once

#include <string>

namespace fusion {

/// Cores allowed by cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us contents: quota / period;
/// 0 for no quota ("-1") or text that is not a number.
double cfs_quota_cores(const std::string& quota_us, const std::string& period_us);

/// Cores allowed by cgroup v2's cpu.max contents ("30000 100000" -> 0.3); 0 for "max ...".
double cpu_max_cores(const std::string& cpu_max);

/// The cpu controller's cgroup of a process, from its /proc/PID/cgroup text.
struct cgroup_cpu_paths {
  std::string v1;  ///< path in the v1 hierarchy that has the "cpu" controller ("" when none)
  std::string v2;  ///< path in the v2 (unified) hierarchy ("" when none)
};

/// Parses /proc/self/cgroup lines "ID:CONTROLLERS:PATH".
cgroup_cpu_paths parse_proc_cgroup(const std::string& text);

/// The smallest quota of the cgroup and its ancestors under `root` (where the hierarchies are
/// mounted: ROOT/cpu or ROOT/cpu,cpuacct for v1, ROOT or ROOT/unified for v2), in cores; 0 when
/// none applies or nothing can be read.
double cgroup_quota_cores(const cgroup_cpu_paths& paths, const std::string& root = "/sys/fs/cgroup");

/// This process's quota in cores (0: none), read again at most once a second, so that a cap put
/// on a running node is seen. Thread-safe.
double process_cpu_quota_cores();

}  // namespace fusion
