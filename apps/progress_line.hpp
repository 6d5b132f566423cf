// A progress line for long-running commands (fusion-data): redrawn in place on a terminal,
// one line every tenth of the way otherwise (logs stay short). Plain C++, stderr only.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace fusion {

/// Reports `done` of `total` units; `unit_scale` and `unit` turn them into what is printed
/// ("MB" with 1e6 for bytes, "merges" with 1 for counts).
class progress_line {
 public:
  progress_line(std::string label, double total, double unit_scale, std::string unit)
      : label_(std::move(label)), total_(total), scale_(unit_scale), unit_(std::move(unit)), tty_(::isatty(2) == 1),
        start_(std::chrono::steady_clock::now()) {}

  /// Redraws (at most ten times a second on a terminal, at each tenth otherwise).
  void update(double done) {
    auto now = std::chrono::steady_clock::now();
    const double frac = total_ > 0 ? std::min(1.0, done / total_) : 1.0;
    if (tty_) {
      if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    } else {
      const int tenth = static_cast<int>(frac * 10);
      if (tenth <= last_tenth_) return;
      last_tenth_ = tenth;
    }
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const int width = 30, filled = static_cast<int>(frac * width);
    std::string bar = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.') + "]";
    const int decimals = scale_ > 1 ? 1 : 0;  // "2.1/4.1 MB", "5568/7935 merges"
    std::fprintf(stderr, "%s%s %s %3.0f%% %.*f/%.*f %s, %.*f %s/s%s", tty_ ? "\r\33[K" : "", label_.c_str(), bar.c_str(),
                 100 * frac, decimals, done / scale_, decimals, total_ / scale_, unit_.c_str(), decimals + 1,
                 s > 0 ? done / scale_ / s : 0.0, unit_.c_str(), tty_ ? "" : "\n");
  }
  /// Ends the line (on a terminal).
  void finish() {
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  std::string label_;
  double total_, scale_;
  std::string unit_;
  bool tty_;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace fusion
