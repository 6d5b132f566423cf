#include "ops/cpu_quota.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

namespace fusion {

namespace {

bool parse_number(const std::string& text, double& out) {
  std::istringstream in(text);
  in >> out;
  return static_cast<bool>(in);
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path);
  if (!in) return false;
  std::getline(in, out);
  return true;
}

// "/a/b" -> {"/a/b", "/a", ""}: the cgroup and its ancestors, the root last.
std::vector<std::string> self_and_ancestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    out.push_back(path);
    const auto slash = path.rfind('/');
    if (path.empty() || slash == std::string::npos) break;
    path.resize(slash);
  }
  return out;
}

// Keeps the tighter of two quotas (none counts as no limit).
void keep_tighter(cpu_quota& best, const cpu_quota& q) {
  if (q.cores > 0 && (best.cores == 0 || q.cores < best.cores)) best = q;
}

// The smallest quota over the directories `mount + p` for p in the ancestors.
template <class Read>
cpu_quota smallest_over(const std::string& mount, const std::string& path, Read read_quota) {
  cpu_quota best;
  for (const std::string& p : self_and_ancestors(path)) keep_tighter(best, read_quota(mount + p));
  return best;
}

}  // namespace

cpu_quota cfs_quota(const std::string& quota_us, const std::string& period_us) {
  double quota = 0, period = 0;
  if (!parse_number(quota_us, quota) || !parse_number(period_us, period) || !(quota > 0 && period > 0)) return {};
  return {quota / period, period * 1e-6};
}

cpu_quota cpu_max_quota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max") return {};
  return cfs_quota(quota, std::to_string(period));
}

cgroup_cpu_paths parse_proc_cgroup(const std::string& text) {
  cgroup_cpu_paths out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      out.v2 = path;
      continue;
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');)
      if (name == "cpu") out.v1 = path;
  }
  return out;
}

cpu_quota cgroup_quota(const cgroup_cpu_paths& paths, const std::string& root) {
  cpu_quota best;
  if (!paths.v1.empty())
    for (const char* mount : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"})
      keep_tighter(best, smallest_over(root + mount, paths.v1, [](const std::string& dir) {
        std::string quota, period;
        return read_file(dir + "/cpu.cfs_quota_us", quota) && read_file(dir + "/cpu.cfs_period_us", period)
                   ? cfs_quota(quota, period)
                   : cpu_quota{};
      }));
  if (!paths.v2.empty())
    for (const char* mount : {"", "/unified"})
      keep_tighter(best, smallest_over(root + mount, paths.v2, [](const std::string& dir) {
        std::string max;
        return read_file(dir + "/cpu.max", max) ? cpu_max_quota(max) : cpu_quota{};
      }));
  return best;
}

cpu_quota process_cpu_quota() {
  using clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static clock::time_point read_at{};
  static std::atomic<double> cores{0}, period_s{0};
  static std::atomic<bool> ever{false};
  const auto now = clock::now();
  std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
  // One thread re-reads; the others keep the last value instead of waiting on the files.
  if (lock.owns_lock() && (!ever.load() || now - read_at >= std::chrono::seconds(1))) {
    std::ifstream in("/proc/self/cgroup");
    std::stringstream text;
    text << in.rdbuf();
    const cpu_quota q = cgroup_quota(parse_proc_cgroup(text.str()));
    cores.store(q.cores);
    period_s.store(q.period_s);
    read_at = now;
    ever.store(true);
  }
  return {cores.load(), period_s.load()};
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace fusion
