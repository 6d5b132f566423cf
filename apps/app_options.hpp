// Option tables for the fusion-* programs. One table row per setting is the single source for
// CAF's parser, --help and the INI linter (core/ini_check.hpp): CAF 0.17's INI reader silently
// drops unknown keys and values of the wrong type, so every file is linted first and every
// problem is reported with its file and line.
#pragma once

#include <caf/all.hpp>

#include <string>
#include <variant>
#include <vector>

#include "core/ini_check.hpp"

namespace fusion {

/// One setting: `--category.name=value` on the command line, `name=value` under `[category]`.
struct option_row {
  const char* category;
  const char* name;
  const char* help;
  std::variant<bool*, int64_t*, uint64_t*, double*, std::string*> target;
};

/// A short flag that stands for an option, e.g. {"--model", "model.file"}.
struct option_alias {
  const char* flag;
  const char* key;
  bool is_string;
};

/// An actor_system_config whose custom options come from `rows`.
class table_config : public caf::actor_system_config {
 public:
  /// Registers the rows with CAF; call once after filling them.
  void add_rows(std::vector<option_row> rows);
  const std::vector<option_row>& rows() const { return rows_; }
  std::vector<ini_option> schema() const;

 private:
  std::vector<option_row> rows_;
};

/// What load_options decided.
enum class load_result { run, exit_ok, exit_usage };

/// Reads `--config FILE` (linted against the table), applies `aliases` and the command line,
/// and parses everything into `cfg`. Prints `usage` and the table for -h/--help (exit_ok);
/// prints problems naming the file and line, or the bad option with a did-you-mean (exit_usage).
load_result load_options(const char* program, const std::string& usage, table_config& cfg, int argc, char** argv,
                         const std::vector<option_alias>& aliases);

}  // namespace fusion
