// CLI11 (Debian's libcli11-dev 2.1) as the fusion-* programs use it. Each program keeps its own
// help text and its own words for mistakes: CLI11 parses, and what it would report itself is
// turned into a usage_error here ("--model needs a value" rather than CLI11's
// "--model: 1 required TEXT missing"). The programs of commands (fusion-cluster, fusion-data,
// fusion-probe) share command_program and run_main; every program shares the did-you-mean
// (unknown_option, unknown_command).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "apps/usage_error.hpp"
#include "core/graph_names.hpp"

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

/// The long and short names of `app`'s options ("--json", "-c"), for a did-you-mean.
inline std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const auto* opt : app.get_options()) {
    for (auto& n : opt->get_lnames()) out.push_back("--" + n);
    for (auto& n : opt->get_snames()) out.push_back("-" + n);
  }
  return out;
}

/// The did-you-mean of every program: " (did you mean '--steps'?)" when `word` is a likely typo
/// of one of `known` (edit distance, core/graph_names.hpp), else "".
inline std::string suggest(const std::string& word, const std::vector<std::string>& known) {
  return did_you_mean(word, known);
}

/// "unknown option '--bacth' for plan (did you mean '--batch'?)"; `command` may be empty.
inline std::string unknown_option(const std::string& flag, const std::vector<std::string>& known,
                                  const std::string& command = {}) {
  return "unknown option '" + flag + "'" + (command.empty() ? "" : " for " + command) + suggest(flag, known);
}

/// "a, b or c".
inline std::string one_of(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

/// "unknown command 'chek' (did you mean 'check'?); commands: check, plan, netns or certs".
inline std::string unknown_command(const std::string& word, const std::vector<std::string>& commands) {
  return "unknown command '" + word + "'" + suggest(word, commands) + "; commands: " + one_of(commands);
}

/// The command line of a program of commands (fusion-cluster, fusion-data, fusion-probe), set
/// up the same way for each: -h/--help (also after a command) and `help` print the usage,
/// --version the version, one command per run, and every mistake becomes a usage_error in
/// plain words with a did-you-mean (options, commands) or the new spelling of a renamed option.
class command_program {
 public:
  command_program(std::string usage, std::string version) : usage_(std::move(usage)), version_(std::move(version)) {
    app_.set_help_flag("-h,--help");  // before the commands: they inherit it
    app_.add_flag("--version", version_given_)->disable_flag_override();
    app_.require_subcommand(0, 1);  // a later "check" is an argument of the first command
    app_.allow_extras();
  }

  /// Adds a command; its own options and positional arguments are added to what it returns.
  CLI::App* command(const std::string& name) {
    auto* cmd = app_.add_subcommand(name);
    cmd->allow_extras();  // unknown options and stray arguments are reported by parse(), in our words
    commands_.push_back(cmd);
    return cmd;
  }

  /// An option of `cmd` taking a value ("--out"; "--security.certs,--certs" for two spellings);
  /// given twice, the last value counts. `given` (false before), when not null, tells after
  /// parse() whether the option was on the command line.
  void option(CLI::App* cmd, const std::string& flags, std::string& target, bool* given = nullptr) {
    auto* opt = cmd->add_option(flags, target)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    if (given) given_.emplace_back(opt, given);
  }

  /// A flag of `cmd` ("--json"); "--json=yes" is a mistake.
  void flag(CLI::App* cmd, const std::string& flags, bool& target) {
    cmd->add_flag(flags, target)->disable_flag_override();
  }

  /// `old_flag` of `cmd` was renamed: it is refused with `advice` ("use --train.batch ...").
  void renamed(CLI::App* cmd, const std::string& old_flag, const std::string& advice) {
    renamed_[{cmd->get_name(), old_flag}] = advice;
  }

  /// Parses argv: the chosen command's name, or "" when the usage or the version was printed
  /// (the program exits 0). Throws usage_error.
  std::string parse(int argc, char** argv) {
    if (!cli::parse(app_, argc, argv, [](const std::string& flag) { return flag + " needs a value"; })) {
      std::cout << usage_;
      return {};
    }
    std::vector<std::string> names;
    for (auto* c : commands_) names.push_back(c->get_name());
    if (auto extra = app_.remaining(); !extra.empty()) {
      if (extra.front() == "help") {
        std::cout << usage_;
        return {};
      }
      if (extra.front().size() > 1 && extra.front()[0] == '-')
        throw usage_error(unknown_option(flag_of(extra.front()), {"--help", "--version"}) + " (options follow a command: " +
                          one_of(names) + ")");
      throw usage_error(unknown_command(extra.front(), names));
    }
    if (version_given_) {
      std::cout << version_ << "\n";
      return {};
    }
    auto chosen = std::find_if(commands_.begin(), commands_.end(), [](const CLI::App* c) { return c->parsed(); });
    if (chosen == commands_.end()) throw usage_error("missing command (" + one_of(names) + ")");
    const std::string cmd = (*chosen)->get_name();
    if (auto extra = (*chosen)->remaining(); !extra.empty()) {
      const std::string& x = extra.front();
      if (x.size() > 1 && x[0] == '-') {
        const std::string flag = flag_of(x);
        if (auto r = renamed_.find({cmd, flag}); r != renamed_.end())
          throw usage_error(flag + " is no longer an option of " + cmd + ": " + r->second);
        throw usage_error(unknown_option(flag, option_names(**chosen), cmd));
      }
      throw usage_error("unexpected argument '" + x + "'");
    }
    // One flag may stand for the same option of several commands: any of them given sets it.
    for (auto& [opt, given] : given_) *given = *given || opt->count() > 0;
    return cmd;
  }

 private:
  CLI::App app_;
  std::string usage_, version_;
  bool version_given_ = false;
  std::vector<CLI::App*> commands_;
  std::map<std::pair<std::string, std::string>, std::string> renamed_;
  std::vector<std::pair<const CLI::Option*, bool*>> given_;
};

/// The main() of a program: runs `body`; a usage_error prints "PROGRAM: message (see --help)"
/// and exits 2, running out of memory "PROGRAM: out of memory (memory_hint)" and any other
/// error "PROGRAM: message" with exit 1 (the exit codes of docs/training.md: 2 a mistake in the
/// command line, 1 an input that is refused or a failure).
inline int run_main(const std::string& program, const std::function<int()>& body, const std::string& memory_hint = {}) {
  try {
    return body();
  } catch (const usage_error& e) {
    std::cerr << program << ": " << e.what() << " (see --help)\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << program << ": out of memory" << (memory_hint.empty() ? "" : " (" + memory_hint + ")") << "\n";
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
  }
  return 1;
}

}  // namespace fusion::cli
