// The logic of fusion-admin, the admin shell of a running coordinator (docs/admin.md): splitting
// and tokenizing command lines, checking them against the commands the shell knows, rendering
// the coordinator's JSON replies as aligned tables, and completion candidates. No CAF here: the
// command names mirror actors/admin_protocol.hpp (a test checks that they agree), so this code
// and its tests stay light.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "base/result.hpp"
#include "core/log.hpp"

namespace fusion::admin {

/// What a command does.
enum class command_kind {
  query,  ///< a read-only topic: query_atom(topic), answered with a JSON object
  verb,   ///< changes the run: command_atom(verb, args), answered with a JSON object or an error
  help,   ///< local: prints the command list
  quit,   ///< local: leaves the shell
};

/// One entry of the shell's command table.
struct command_spec {
  std::string name;
  command_kind kind;
  size_t min_args = 0, max_args = 0;
  std::string usage;    ///< "move OP|GLOB NODE"
  std::string summary;  ///< one line for `help`
};

/// Every command, topics first then verbs then the local ones, in the order `help` lists them.
const std::vector<command_spec>& commands();

/// The names of the commands of one kind, in table order (for checks against the protocol).
std::vector<std::string> command_names(command_kind kind);

/// The entry named `name`, or nullptr.
const command_spec* find_command(std::string_view name);

/// One checked command of a line.
struct command {
  const command_spec* spec = nullptr;
  std::string name;
  std::vector<std::string> args;
};

/// A parsed line: its commands, or (when `error` is set) none, so a typo never runs half a line.
struct parsed_line {
  std::vector<command> commands;
  std::string error;  ///< in plain words, with a did-you-mean for unknown commands
};

/// Splits a line into command texts on ';' outside quotes ('...' or "...") and not escaped
/// with a backslash; the pieces keep their quotes. Blank pieces are dropped. Throws
/// std::runtime_error for an unterminated quote.
std::vector<std::string> split_commands(std::string_view line);

/// Splits one command text into words on blanks; quotes group words and are removed, a
/// backslash outside single quotes takes the next character literally. Throws
/// std::runtime_error for an unterminated quote.
std::vector<std::string> tokenize(std::string_view text);

/// Splits, tokenizes and checks every command of `line` (names and argument counts). A line
/// that is blank or starts with '#' gives no commands and no error.
parsed_line parse_line(std::string_view line);

/// Whether `words` is a command; fails with the problem: an unknown name with the closest known
/// one, or a wrong number of arguments with the command's usage.
status check_command(const std::vector<std::string>& words);

/// The text `help` prints: every command with its usage and summary; with `topic`, that command only.
std::string help_text(std::string_view topic = {});

/// Command names that start with `prefix`, sorted (tab completion).
std::vector<std::string> completions(std::string_view prefix);

/// Completion of the word `prefix` that follows `before` on the line: command names where a
/// command starts (line start, after ';') or after `help`; nothing for other arguments.
std::vector<std::string> completions_in(std::string_view before, std::string_view prefix);

/// "42s", "1m05s", "2h03m", "3d04h"; "-" for an unknown time (core/log.hpp, shared with the
/// progress lines of fusion-train).
using fusion::format_duration;

/// "512 B", "64.0 KiB", "3.2 MiB", "1.50 GiB".
std::string format_bytes(double bytes);

/// The reply to a query rendered as aligned tables: one layout per topic, key/value lines for
/// anything else (a verb's answer, an unknown topic). Missing fields print as "-".
std::string render(std::string_view name, const nlohmann::json& reply);

/// Columns padded to their widest cell, two blanks apart; `right` marks right-aligned columns.
std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right = {});

}  // namespace fusion::admin
