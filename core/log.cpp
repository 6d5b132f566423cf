#include "core/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace fusion {

const char* log_level_name(log_level level) {
  switch (level) {
    case log_level::info: return "INFO";
    case log_level::warn: return "WARN";
    default: return "ERROR";
  }
}

std::string format_log_line(log_level level, const std::string& who, const std::string& msg) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  auto ms = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02d %02d:%02d:%02d.%03d %-5s ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms < 0 ? 0 : ms, log_level_name(level));
  std::string line = stamp;
  if (!who.empty()) line += who + ": ";
  line += msg;
  if (line.empty() || line.back() != '\n') line += '\n';
  return line;
}

void log_line(log_level level, const std::string& who, const std::string& msg) {
  std::string line = format_log_line(level, who, msg);
  // One write for the whole line; loop only on a short write or EINTR.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(2, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void log_info(const std::string& who, const std::string& msg) { log_line(log_level::info, who, msg); }
void log_warn(const std::string& who, const std::string& msg) { log_line(log_level::warn, who, msg); }
void log_error(const std::string& who, const std::string& msg) { log_line(log_level::error, who, msg); }

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e15)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string format_seconds(double seconds) { return format_number(seconds) + " s"; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  long long s = std::llround(seconds);
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
  return buf;
}

}  // namespace fusion
