// A tiny logger for the programs' own messages (fusion-node, node actors): one line per call,
//
//     2026-11-23 12:00:01.234 INFO  fusion-node n1: joined the coordinator at 127.0.0.1:7700
//
// written to stderr with a single write(2), so lines from several threads never interleave.
// Local time, millisecond resolution; the level is padded to five characters. Thread-safe, no
// global state besides stderr. Plain C++ (no CAF), usable from every layer above core/.
#pragma once

#include <string>

namespace fusion {

enum class log_level { info, warn, error };

/// "INFO", "WARN" or "ERROR".
const char* log_level_name(log_level level);

/// The whole line `log_line` writes for `who` and `msg` (with the current time and a final
/// '\n'): "2026-11-23 12:00:01.234 INFO  fusion-node n1: message\n". An empty `who` drops the
/// "who: " part.
std::string format_log_line(log_level level, const std::string& who, const std::string& msg);

/// Writes format_log_line(...) to stderr in one write(2).
void log_line(log_level level, const std::string& who, const std::string& msg);

/// Shorthands of log_line; `who` names the program and instance, e.g. "fusion-node n1".
void log_info(const std::string& who, const std::string& msg);
void log_warn(const std::string& who, const std::string& msg);
void log_error(const std::string& who, const std::string& msg);

/// A duration for people: "600 s", "1.5 s", "0.25 s", "0.001 s" (at most three decimals,
/// trailing zeros dropped; never "600.000000"). Use it instead of std::to_string(double).
std::string format_seconds(double seconds);

/// A clock-style duration for progress lines and tables: "42s", "1m05s", "2h03m", "3d04h"; "-" for
/// an unknown (negative or not finite) time.
std::string format_duration(double seconds);

/// A plain number the same way, without the unit: "600", "1.5", "0.1", "1e-08" for tiny values.
std::string format_number(double value);

}  // namespace fusion
