#include "apps/app_options.hpp"

#include "apps/cli.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "base/file_text.hpp"
#include "core/log.hpp"
#include "core/wire.hpp"

#ifndef FUSION_VERSION
#error "FUSION_VERSION must come from the top-level CMakeLists.txt (project(fusion VERSION ...))"
#endif

namespace fusion {

namespace {

ini_option::kind kind_of(const option_row& r) {
  switch (r.target.index()) {
    case 0: return ini_option::kind::boolean;
    case 1: return ini_option::kind::integer;
    case 2: return ini_option::kind::unsigned_integer;
    case 3: return ini_option::kind::real;
    default: return ini_option::kind::string;
  }
}

const char* kind_name(ini_option::kind k) {
  switch (k) {
    case ini_option::kind::boolean: return "bool";
    case ini_option::kind::integer: return "int";
    case ini_option::kind::unsigned_integer: return "uint";
    case ini_option::kind::real: return "real";
    default: return "string";
  }
}

std::string key_of(const option_row& r) { return std::string(r.category) + "." + r.name; }

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The config file with every `name=WORD` (or "WORD") of an option row that has a word replaced
// by `name=VALUE`, line for line (problems keep their line numbers): CAF and the linter then see
// the integer the word stands for.
std::string replace_words(const std::string& text, const std::vector<option_row>& rows) {
  std::istringstream in(text);
  std::string out, line, category;
  while (std::getline(in, line)) {
    const std::string t = trimmed(line);
    if (t.size() > 2 && t.front() == '[' && t.back() == ']') category = trimmed(t.substr(1, t.size() - 2));
    const size_t eq = t.find('=');
    if (eq != std::string::npos && t.front() != ';') {
      const std::string key = trimmed(t.substr(0, eq));
      std::string value = trimmed(t.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      for (auto& r : rows)
        if (r.word && category == r.category && key == r.name && value == r.word)
          line = key + "=" + std::to_string(r.word_value);
    }
    out += line + "\n";
  }
  return out;
}

/// " (default: VALUE)" from the row's target before parsing, "" when it has none (an empty text).
std::string default_of(const option_row& r) {
  std::string v = std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return p->empty() ? "" : "\"" + *p + "\"";
        else if constexpr (std::is_same_v<T, double>) return format_number(*p);
        else return std::to_string(*p);
      },
      r.target);
  return v.empty() ? "" : " (default: " + v + ")";
}

/// What an option's value must look like, in words: "takes a whole number, e.g. 100".
std::string expected_value(const option_row& r) {
  switch (r.target.index()) {
    case 0: return "is true or false";
    case 1: return "takes a whole number, e.g. 100 (no exponent, no quotes)";
    case 2: return "takes a whole number of at least 0, e.g. 1337 (no sign, exponent or quotes)";
    case 3: return "takes a number, e.g. 0.001 or 1.0e-3";
    default: return "takes a text; put it in double quotes when it holds spaces or quotes";
  }
}

/// The command line, sorted out: what goes to CAF's parser and what this file handles itself.
struct parsed_args {
  std::vector<std::string> caf_args;                       ///< "--category.key=value" of the table's options
  std::vector<std::pair<const option_row*, bool>> bools;   ///< bool options, applied after CAF's parse
  std::set<std::string> cli_keys;                          ///< "category.key" given on the command line
  std::vector<std::string> stray;                          ///< arguments that belong to no option
  std::vector<std::string> overrides;                      ///< what CLI11 left, in order, for override_args
  std::string config_file;
  bool help = false, version = false;
};

bool parse_bool(const std::string& text, bool& out) {
  if (text == "true") out = true;
  else if (text == "false") out = false;
  else return false;
  return true;
}

/// CLI11 takes the fixed options (-h/--help, --version, --config FILE) and leaves the rest, in
/// order, to override_args. The table's options are not CLI11 options because they fit it
/// badly: their values go to CAF's parser together with the config file, so that CAF types
/// both alike; "--key=" is an empty value (CLI11 2.1 would take the next argument); a bool takes
/// the next word only when it is true or false; and an option not in the table is refused, with
/// a did-you-mean. Throws usage_error.
parsed_args split_args(int argc, char** argv) {
  parsed_args out;
  CLI::App app;
  app.set_help_flag("-h,--help");
  app.add_flag("--version", out.version)->disable_flag_override();
  auto* config = app.add_option("--config", out.config_file)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();
  out.help = !cli::parse(app, argc, argv, [](const std::string& flag) {
    return flag + " needs a file name (" + flag + "=VALUE or " + flag + " VALUE)";
  });
  if (!out.help && config->count() > 0 && out.config_file.empty()) throw usage_error("--config needs a file name");
  out.overrides = app.remaining();
  return out;
}

/// Rewrites the overrides that split_args left (`--key value`, aliases and bools) into what
/// CAF 0.17 understands (`--key=value`), and collects the bools and stray words. Throws usage_error.
void override_args(parsed_args& out, const std::vector<option_row>& rows, const std::vector<option_alias>& aliases) {
  std::map<std::string, const option_row*> by_flag;
  for (auto& r : rows) by_flag["--" + key_of(r)] = &r;
  const std::vector<std::string>& args = out.overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      out.stray.push_back(a);
      continue;
    }
    auto eq = a.find('=');
    std::string flag = a.substr(0, eq);
    bool has_value = eq != std::string::npos;
    std::string value = has_value ? a.substr(eq + 1) : "";
    auto take_value = [&](const std::string& what) {
      if (has_value) return;
      if (i + 1 >= args.size()) throw usage_error(flag + " needs " + what + " (" + flag + "=VALUE or " + flag + " VALUE)");
      value = args[++i];
      has_value = true;
    };
    const option_row* row = nullptr;
    bool alias_string = false;
    if (auto al = std::find_if(aliases.begin(), aliases.end(), [&](auto& x) { return flag == x.flag; });
        al != aliases.end()) {
      auto it = by_flag.find(std::string("--") + al->key);
      if (it == by_flag.end()) throw std::logic_error(flag + " is an alias of unknown option " + al->key);
      row = it->second;
      alias_string = al->is_string;
    } else if (auto it = by_flag.find(flag); it != by_flag.end()) {
      row = it->second;
    }
    if (!row) {
      // Not ours. CAF's own options (scheduler.max-threads, logger.*, middleman.*) would pass
      // unchecked, beside ours that set them (runtime.threads); the config file refuses them too.
      std::vector<std::string> known;
      for (auto& r : rows) known.push_back("--" + key_of(r));
      for (auto& al : aliases) known.push_back(al.flag);
      throw usage_error(cli::unknown_option(flag, known));
    }
    const std::string key = key_of(*row), option = "--" + key;
    out.cli_keys.insert(key);
    if (std::holds_alternative<bool*>(row->target)) {
      // A bare flag means true; "--flag true|false" takes the next word only when it is one of those.
      bool v = true;
      if (!has_value && i + 1 < args.size() && parse_bool(args[i + 1], v)) {
        ++i;
      } else if (has_value && !parse_bool(value, v)) {
        throw usage_error("bad value in '" + a + "': " + option + " is true or false (" + option +
                          " alone means true)");
      }
      out.bools.emplace_back(row, v);
      continue;
    }
    take_value("a value");
    if (row->word && (value == row->word || value == "\"" + std::string(row->word) + "\""))
      value = std::to_string(row->word_value);
    // The INI rule holds here too (core/ini_check.hpp): a real needs a decimal point or an
    // exponent, so that a value means the same on the command line and in a config file.
    if (std::holds_alternative<double*>(row->target) && !value.empty() &&
        value.find_first_not_of("+-0123456789") == std::string::npos)
      throw usage_error("bad value in '" + a + "': " + key + " takes a real number with a decimal point, e.g. " +
                        value + ".0 (as in INI files)");
    // CAF rejects "--key=" outright; an empty string option must be spelled --key="". A string
    // is passed raw (CAF keeps it as written) unless it is already quoted.
    bool is_string = alias_string || std::holds_alternative<std::string*>(row->target);
    if (value.empty() && is_string) value = "\"\"";
    out.caf_args.push_back(option + "=" + value);
  }
}

/// CAF reports "parser_error(not_an_option, ({"argument" = "--x=1"}))" or the name of its parser's
/// state ("trailing_character"); say it in our words, from the option's type, and suggest the
/// closest known option.
void report_cli_error(const char* program, const table_config& cfg, const std::vector<std::string>& args,
                      const std::string& caf_text) {
  std::string bad;
  for (auto& a : args)
    if (caf_text.find("\"" + a + "\"") != std::string::npos) bad = a;
  // CAF escapes a quote inside the value ("--x=5\""), so the exact match fails: take the option
  // whose key it names.
  for (auto& a : args)
    if (bad.empty() && a.find('=') != std::string::npos &&
        caf_text.find("\"" + a.substr(0, a.find('=') + 1)) != std::string::npos)
      bad = a;
  std::string key = bad.substr(0, bad.find('='));
  std::vector<std::string> known;
  const option_row* row = nullptr;
  for (auto& r : cfg.rows()) {
    known.push_back("--" + key_of(r));
    if ("--" + key_of(r) == key) row = &r;
  }
  if (bad.empty()) {
    std::cerr << program << ": bad command line (see --help)\n";
  } else if (caf_text.find("not_an_option") != std::string::npos || !row) {
    std::cerr << program << ": " << cli::unknown_option(key, known) << " (see --help)\n";
  } else {
    std::cerr << program << ": bad value in '" << bad << "': " << key.substr(2) << " " << expected_value(*row)
              << " (see --help)\n";
  }
}

// Marks a path option the config file may set: no INI value or command line can produce it.
const std::string unset_path = "\x1f(unset)\x1f";

}  // namespace

void table_config::add_rows(std::vector<option_row> rows) {
  for (auto& r : rows) {
    caf::config_option_adder group{custom_options_, r.category};
    std::visit([&](auto* p) { group.add(*p, r.name, r.help); }, r.target);
    rows_.push_back(r);
  }
}

std::vector<ini_option> table_config::schema() const {
  std::vector<ini_option> out;
  for (auto& r : rows_) out.push_back({r.category, r.name, kind_of(r), r.max});
  return out;
}

std::string version_line(const std::string& program) {
  return program + " " + FUSION_VERSION + " (wire protocol " + std::to_string(wire_protocol_version) + ")";
}

std::string resolve_config_path(const std::string& path, const std::string& config_file) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute()) return path;
  fs::path dir = fs::path(config_file).parent_path();
  if (dir.empty()) return path;
  return (dir / path).lexically_normal().string();
}

load_result load_options(const char* program, const std::string& usage, table_config& cfg, int argc, char** argv,
                         const std::vector<option_alias>& aliases) {
  parsed_args args;
  try {
    args = split_args(argc, argv);
    if (!args.help && !args.version) override_args(args, cfg.rows(), aliases);
  } catch (const usage_error& e) {
    std::cerr << program << ": " << e.what() << " (see --help)\n";
    return load_result::exit_usage;
  }
  if (args.help) {
    std::cout << usage << "\noptions (--category.key=value or --category.key value; a bool alone means true):\n";
    for (auto& r : cfg.rows()) {
      std::string key = "--" + key_of(r) + "=<" + (r.is_path ? "path" : kind_name(kind_of(r))) +
                        (r.word ? std::string("|") + r.word : std::string()) + ">";
      std::printf("  %-36s %s%s\n", key.c_str(), r.help, default_of(r).c_str());
    }
    std::printf("  %-36s %s\n", "--version", "print the version and exit");
    std::cout << std::flush;
    return load_result::exit_ok;
  }
  if (args.version) {
    std::cout << version_line(program) << std::endl;
    return load_result::exit_ok;
  }
  // One read of the file serves both the linter and CAF's parser.
  std::stringstream ini;
  if (!args.config_file.empty()) {
    auto read = read_file_text(args.config_file, "config file");
    if (!read) {
      std::cerr << program << ": " << read.error() << "\n";
      return load_result::exit_usage;
    }
    // A file saved with Windows line endings means the same as without them.
    std::string text = std::move(*read);
    text.erase(std::remove(text.begin(), text.end(), '\r'), text.end());
    ini.str(replace_words(text, cfg.rows()));
    auto problems = check_ini(ini.str(), args.config_file, cfg.schema());
    if (!problems.empty()) {
      for (auto& p : problems) std::cerr << to_string(p) << "\n";
      std::cerr << program << ": " << problems.size() << " problem(s) in " << args.config_file << "\n";
      return load_result::exit_usage;
    }
  }
  // A path the config file sets is relative to the file's directory; to tell it from the
  // default, every path option the command line leaves alone starts out as a marker.
  std::vector<std::pair<std::string*, std::string>> path_defaults;
  for (auto& r : cfg.rows())
    if (r.is_path && !args.cli_keys.count(key_of(r))) {
      auto* target = std::get<std::string*>(r.target);
      path_defaults.emplace_back(target, *target);
      *target = unset_path;
    }
  auto err = cfg.parse(args.caf_args, ini);
  for (auto& [target, default_value] : path_defaults)
    *target = *target == unset_path ? default_value : resolve_config_path(*target, args.config_file);
  if (err) {
    report_cli_error(program, cfg, args.caf_args, cfg.render(err));
    return load_result::exit_usage;
  }
  if (!args.stray.empty()) {
    std::cerr << program << ": unexpected argument '" << args.stray.front()
              << "' (options are --category.key=value or --category.key value; see --help)\n";
    return load_result::exit_usage;
  }
  for (auto& [row, value] : args.bools) *std::get<bool*>(row->target) = value;
  for (auto& r : cfg.rows()) {
    if (auto* u = std::get_if<uint64_t*>(&r.target); u && r.max > 0 && **u > r.max) {
      std::cerr << program << ": --" << key_of(r) << "=" << **u << ": must be at most " << r.max << "\n";
      return load_result::exit_usage;
    }
    // A literal inf or nan is refused by the parser, but 1e400 overflows to inf on the way in.
    if (auto* d = std::get_if<double*>(&r.target); d && !std::isfinite(**d)) {
      std::cerr << program << ": --" << key_of(r) << ": must be a finite number (a value beyond 1.8e308 overflows)\n";
      return load_result::exit_usage;
    }
  }
  return cfg.cli_helptext_printed ? load_result::exit_ok : load_result::run;
}

void install_stop_signal_handler(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

std::vector<option_row> security_rows(security::security_settings& s) {
  return {
      {"security", "mode", "tls (default: mutual TLS, admission by certificate) or off (plaintext, unauthenticated)",
       &s.mode},
      path_option("security", "certs", "directory made by `fusion-cluster certs`; this program takes its files from it",
                  &s.certs),
      path_option("security", "ca", "the cluster CA certificate (overrides the one in security.certs)", &s.files.ca),
      path_option("security", "certificate", "this program's certificate (overrides security.certs)",
                  &s.files.certificate),
      path_option("security", "key", "this program's private key (overrides security.certs)", &s.files.key),
  };
}

std::shared_ptr<const security::credentials> load_security(const std::string& program,
                                                          const security::security_settings& s, security::role r,
                                                          const std::string& name) {
  try {
    auto creds = security::load_credentials(s, r, name);
    if (!creds) std::fprintf(stderr, "%s\n", security::plaintext_warning(program).c_str());
    return creds;
  } catch (const std::runtime_error& e) {
    throw usage_error(e.what());
  }
}

}  // namespace fusion
