// Option tables for the fusion-* programs. One table row per setting is the single source for
// CAF's parser, --help and the INI linter (core/ini_check.hpp): CAF 0.17's INI reader silently
// drops unknown keys and values of the wrong type, so every file is linted first and every
// problem is reported with its file and line.
//
// Command line: `--category.key=value` and `--category.key value` are the same; a bool option
// alone (`--runtime.quiet`) means true, and `--runtime.quiet=true|false` (or `... true|false`)
// sets it either way (CAF 0.17 itself only knows the bare flag). Relative paths that a config
// file gives to a path option (model.file, data.file, ...) are relative to the config file's
// directory; paths on the command line stay relative to the current directory.
#pragma once

#include <caf/all.hpp>

#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "apps/usage_error.hpp"
#include "core/ini_check.hpp"
#include "security/certs.hpp"

namespace fusion {

/// One setting: `--category.name=value` on the command line, `name=value` under `[category]`.
struct option_row {
  const char* category;
  const char* name;
  const char* help;
  std::variant<bool*, int64_t*, uint64_t*, double*, std::string*> target;
  uint64_t max = 0;      ///< unsigned options: largest accepted value, e.g. 65535 for a port (0: none)
  bool is_path = false;  ///< a file path: a relative value in the config file is resolved against its directory
  /// Integer options: a word that may stand for the value `word_value` (train.micro-batches'
  /// "auto" for 0), on the command line and in the config file, quoted or not.
  const char* word = nullptr;
  int64_t word_value = 0;
};

/// The longest wait an option in seconds may ask for (a timeout, a grace period): 10^6 s, 11.6
/// days. Far beyond it, a deadline computed in nanoseconds from now overflows and passes at once.
inline constexpr double max_wait_s = 1e6;

/// The most threads an option may ask for (runtime.threads, runtime.blas-threads): every one
/// of them is started, with its stack, before the run begins.
inline constexpr uint64_t max_threads = 1024;

/// A path option row (see option_row::is_path).
inline option_row path_option(const char* category, const char* name, const char* help, std::string* target) {
  return option_row{category, name, help, target, 0, true};
}

/// A short flag that stands for an option, e.g. {"--model", "model.file"}.
struct option_alias {
  const char* flag;
  const char* key;
  bool is_string;
};

/// An actor_system_config whose custom options come from `rows`.
class table_config : public caf::actor_system_config {
 public:
  /// Registers the rows with CAF and appends them to rows() (a program adds its own, then the
  /// shared ones such as security_rows).
  void add_rows(std::vector<option_row> rows);
  const std::vector<option_row>& rows() const { return rows_; }
  std::vector<ini_option> schema() const;

 private:
  std::vector<option_row> rows_;
};

/// The [security] rows every program shares (docs/security.md): mode, certs, ca, certificate, key.
std::vector<option_row> security_rows(security::security_settings& s);

/// The credentials of holder (r, name) under `s` (null for security.mode=off, after printing the
/// plaintext warning once); any problem becomes a usage_error naming the key or the file.
std::shared_ptr<const security::credentials> load_security(const std::string& program,
                                                          const security::security_settings& s, security::role r,
                                                          const std::string& name = {});

/// What load_options decided.
enum class load_result { run, exit_ok, exit_usage };

/// Reads `--config FILE` (linted against the table), applies `aliases` and the command line,
/// and parses everything into `cfg`. Prints `usage` and the table for -h/--help and the
/// version_line for --version (exit_ok); prints problems naming the file and line, or the bad
/// option with a did-you-mean (exit_usage).
load_result load_options(const char* program, const std::string& usage, table_config& cfg, int argc, char** argv,
                         const std::vector<option_alias>& aliases);

/// "fusion-train 0.4.0 (wire protocol 3)": the project version (CMake project(VERSION)) and
/// core/wire.hpp's wire_protocol_version; what every fusion-* program prints for --version.
std::string version_line(const std::string& program);

/// `path` resolved against the directory of `config_file`: unchanged when it is empty or
/// absolute or when the config file has no directory part; else "DIR/path", lexically normalised
/// ("configs/runs/../../data/kjv.txt" -> "data/kjv.txt").
std::string resolve_config_path(const std::string& path, const std::string& config_file);

/// Installs `handler` for SIGINT and SIGTERM (restarting interrupted system calls).
void install_stop_signal_handler(void (*handler)(int));

}  // namespace fusion
