// Linter for CAF 0.17 INI config files (configs/nodes/*.ini).
//
// CAF 0.17's INI reader ignores unknown keys and categories without a word and keeps the default
// when a value has the wrong type (lr=1 for a double, batch=-1 for a size_t, a timespan without
// unit, a string where a list is expected). check_ini reports all of these, so a node can refuse
// to start on a config that would silently run with settings nobody asked for.
//
// Syntax accepted (as CAF 0.17 reads it): ';' comments, [category] and [category.sub] headers,
// key=value with values: "quoted strings" (escapes \n \r \t \\ \"), 'atoms', true/false,
// integers (42, -3, 0x1f, 0b101, 017 octal), reals (1.0, 1e-3), timespans (10ns, 10us, 250ms,
// 3s, 1min, 2h), <uris>, lists [a, b] (may span lines) and maps {k=v, ...}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusion {

/// One option a program accepts: `name` under `[category]`, with the type CAF parses it as.
struct ini_option {
  std::string category, name;
  enum class kind { boolean, integer, unsigned_integer, real, string, timespan, string_list, integer_list } type;
  uint64_t max = 0;  ///< integer kinds: largest accepted value, e.g. 65535 for a port (0: no limit)
};

/// One problem found in a file.
struct ini_problem {
  std::string file;
  int line = 0;
  std::string message;  ///< e.g. "[train] lr: expected a real number with a decimal point (e.g. 1.0), got 1"
};

/// "file:line: message".
std::string to_string(const ini_problem& p);

/// Checks INI `text` (named `file` in the problems) against `schema`; returns the problems in
/// file order, empty when CAF will read every value exactly as written. Reports: malformed
/// lines, keys outside any category, unknown categories and keys (with the closest known name),
/// values of the wrong type (naming the expected kind) and duplicate keys.
std::vector<ini_problem> check_ini(const std::string& text, const std::string& file,
                                   const std::vector<ini_option>& schema);

/// Human name of an option kind with an example, e.g. "a real number with a decimal point (e.g. 1.0)".
std::string ini_kind_description(ini_option::kind k);

}  // namespace fusion
