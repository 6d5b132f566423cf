// CLI11 (Debian's libcli11-dev 2.1) as the fusion-* programs use it. Each program keeps its own
// help text and its own words for mistakes: CLI11 parses, and what it would report itself is
// turned into a usage_error here ("--model needs a value" rather than CLI11's
// "--model: 1 required TEXT missing").
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "apps/usage_error.hpp"

namespace fusion::cli {

/// "--key" of "--key=value"; any other argument unchanged.
inline std::string flag_of(const std::string& arg) {
  auto eq = arg.find('=');
  return arg.rfind("--", 0) == 0 && eq != std::string::npos ? arg.substr(0, eq) : arg;
}

/// Whether `app` or one of its subcommands has an option `flag` ("--name") that takes a value.
inline bool takes_value(const CLI::App& app, const std::string& flag) {
  if (auto* opt = app.get_option_no_throw(flag); opt && opt->get_items_expected_max() > 0) return true;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (takes_value(*sub, flag)) return true;
  return false;
}

/// How a program says that `flag`, given last, lacks its value (e.g. "--out needs a value").
using needs_value_words = std::function<std::string(const std::string& flag)>;

/// Parses argv[1..argc) into `app`; false when -h/--help was given (the caller prints its help).
/// CLI11's own parse errors become usage_errors in plain words: an option given last without
/// its value (needs_value's words), a value given to a flag, anything else in CLI11's words.
inline bool parse(CLI::App& app, int argc, char** argv, const needs_value_words& needs_value) {
  // CLI11 2.1 reads "--name=" as "--name" alone and takes the next argument as its value; here,
  // as in the hand-written loops before, it is an empty value.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {
    std::string a = argv[i];
    if (a.size() > 3 && a.back() == '=' && a.rfind("--", 0) == 0 && a.find('=') == a.size() - 1 &&
        takes_value(app, a.substr(0, a.size() - 1))) {
      args.emplace_back();
      args.push_back(a.substr(0, a.size() - 1));
    } else {
      args.push_back(std::move(a));
    }
  }
  try {
    app.parse(args);  // reversed, as CLI11 wants it
    return true;
  } catch (const CLI::CallForHelp&) {
    return false;
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 throws it for a flag given a value (the flags disable_flag_override()) and for an
    // option that is the last argument and so lacks its value; that one it names by its first
    // long name (--command for -c): the flag as the user typed it reads better.
    const std::string what = e.what(), marker = " was given a disallowed flag override";
    if (auto at = what.find(marker); at != std::string::npos) throw usage_error("--" + what.substr(0, at) + " takes no value");
    throw usage_error(needs_value(flag_of(argv[argc - 1])));
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
}

/// After parse() of a program of commands (`commands`, at most one of them given): "help" for
/// `help` given as the command, "--version" for --version (`version`) with no stray word before
/// it, else the name of the command given. Throws usage_error for an unknown command, no command,
/// and an unknown option or extra argument of the command; `names` lists the commands for
/// those messages ("check, plan or certs").
inline std::string chosen_command(const CLI::App& app, const std::vector<CLI::App*>& commands, const std::string& names,
                                  bool version) {
  if (auto extra = app.remaining(); !extra.empty()) {
    if (extra.front() == "help") return "help";
    throw usage_error("unknown command '" + extra.front() + "' (" + names + ")");
  }
  if (version) return "--version";
  auto chosen = std::find_if(commands.begin(), commands.end(), [](const CLI::App* c) { return c->parsed(); });
  if (chosen == commands.end()) throw usage_error("missing command (" + names + ")");
  const std::string cmd = (*chosen)->get_name();
  if (auto extra = (*chosen)->remaining(); !extra.empty()) {
    const std::string& x = extra.front();
    if (x.size() > 1 && x[0] == '-') throw usage_error("unknown option '" + flag_of(x) + "' for " + cmd);
    throw usage_error("unexpected argument '" + x + "'");
  }
  return cmd;
}

/// The long and short names of `app`'s options ("--json", "-c"), for a did-you-mean.
inline std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const auto* opt : app.get_options()) {
    for (auto& n : opt->get_lnames()) out.push_back("--" + n);
    for (auto& n : opt->get_snames()) out.push_back("-" + n);
  }
  return out;
}

}  // namespace fusion::cli
