#include "ops/cpu_quota.hpp"

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

// The smallest positive quota over the directories `mount + p` for p in the ancestors.
template <class Read>
double smallest_over(const std::string& mount, const std::string& path, Read read_cores) {
  double best = 0;
  for (const std::string& p : self_and_ancestors(path)) {
    const double cores = read_cores(mount + p);
    if (cores > 0 && (best == 0 || cores < best)) best = cores;
  }
  return best;
}

}  // namespace

double cfs_quota_cores(const std::string& quota_us, const std::string& period_us) {
  double quota = 0, period = 0;
  if (!parse_number(quota_us, quota) || !parse_number(period_us, period)) return 0;
  return quota > 0 && period > 0 ? quota / period : 0;
}

double cpu_max_cores(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max") return 0;
  return cfs_quota_cores(quota, std::to_string(period));
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

double cgroup_quota_cores(const cgroup_cpu_paths& paths, const std::string& root) {
  double best = 0;
  auto keep = [&best](double cores) {
    if (cores > 0 && (best == 0 || cores < best)) best = cores;
  };
  if (!paths.v1.empty())
    for (const char* mount : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"})
      keep(smallest_over(root + mount, paths.v1, [](const std::string& dir) {
        std::string quota, period;
        return read_file(dir + "/cpu.cfs_quota_us", quota) && read_file(dir + "/cpu.cfs_period_us", period)
                   ? cfs_quota_cores(quota, period)
                   : 0.0;
      }));
  if (!paths.v2.empty())
    for (const char* mount : {"", "/unified"})
      keep(smallest_over(root + mount, paths.v2, [](const std::string& dir) {
        std::string max;
        return read_file(dir + "/cpu.max", max) ? cpu_max_cores(max) : 0.0;
      }));
  return best;
}

double process_cpu_quota_cores() {
  using clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static clock::time_point read_at{};
  static std::atomic<double> cores{0};
  static std::atomic<bool> ever{false};
  const auto now = clock::now();
  std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
  // One thread re-reads; the others keep the last value instead of waiting on the files.
  if (lock.owns_lock() && (!ever.load() || now - read_at >= std::chrono::seconds(1))) {
    std::ifstream in("/proc/self/cgroup");
    std::stringstream text;
    text << in.rdbuf();
    cores.store(cgroup_quota_cores(parse_proc_cgroup(text.str())));
    read_at = now;
    ever.store(true);
  }
  return cores.load();
}

}  // namespace fusion
