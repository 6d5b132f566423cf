#include "apps/app_options.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/graph_names.hpp"

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

/// Rewrites the aliases into CAF's --key=value form and pulls out "--config F".
std::vector<std::string> normalise_args(int argc, char** argv, std::string& config_file,
                                        const std::vector<option_alias>& aliases) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string key = a.substr(0, eq);
    bool has_value = eq != std::string::npos;
    std::string value = has_value ? a.substr(eq + 1) : "";
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (key == "--config") {
      if (!take_value()) throw std::runtime_error("--config needs a file name");
      config_file = value;
      continue;
    }
    auto alias = std::find_if(aliases.begin(), aliases.end(), [&](auto& al) { return key == al.flag; });
    if (alias != aliases.end()) {
      if (!take_value()) throw std::runtime_error(key + " needs a value");
      out.push_back(std::string("--") + alias->key + "=" + (alias->is_string ? "\"" + value + "\"" : value));
      continue;
    }
    // CAF rejects "--key=" outright; an empty string option must be spelled --key="".
    out.push_back(has_value && value.empty() ? a + "\"\"" : a);
  }
  return out;
}

/// CAF reports "parser_error(not_an_option, ({"argument" = "--x=1"}))"; say it in our words and
/// suggest the closest known option.
void report_cli_error(const char* program, const table_config& cfg, const std::vector<std::string>& args,
                      const std::string& caf_text) {
  std::string bad;
  for (auto& a : args)
    if (caf_text.find("\"" + a + "\"") != std::string::npos) bad = a;
  std::string key = bad.substr(0, bad.find('='));
  std::vector<std::string> known;
  for (auto& r : cfg.rows()) known.push_back(std::string("--") + r.category + "." + r.name);
  if (bad.empty()) {
    std::cerr << program << ": bad command line: " << caf_text << "\n";
  } else if (caf_text.find("not_an_option") != std::string::npos) {
    std::cerr << program << ": unknown option '" << key << "'" << did_you_mean(key, known) << " (see --help)\n";
  } else {
    auto open = caf_text.find('('), comma = caf_text.find(',');
    std::string reason =
        open < comma && comma != std::string::npos ? caf_text.substr(open + 1, comma - open - 1) : caf_text;
    std::replace(reason.begin(), reason.end(), '_', ' ');
    std::cerr << program << ": bad value in '" << bad << "': " << reason << " (see --help for the option's type)\n";
  }
}

}  // namespace

void table_config::add_rows(std::vector<option_row> rows) {
  rows_ = std::move(rows);
  for (auto& r : rows_) {
    caf::config_option_adder group{custom_options_, r.category};
    std::visit([&](auto* p) { group.add(*p, r.name, r.help); }, r.target);
  }
}

std::vector<ini_option> table_config::schema() const {
  std::vector<ini_option> out;
  for (auto& r : rows_) out.push_back({r.category, r.name, kind_of(r)});
  return out;
}

load_result load_options(const char* program, const std::string& usage, table_config& cfg, int argc, char** argv,
                         const std::vector<option_alias>& aliases) {
  std::string config_file;
  auto args = normalise_args(argc, argv, config_file, aliases);
  if (std::any_of(args.begin(), args.end(), [](auto& a) { return a == "-h" || a == "--help"; })) {
    std::cout << usage << "\noptions:\n";
    for (auto& r : cfg.rows()) {
      std::string key = std::string("--") + r.category + "." + r.name + "=<" + kind_name(kind_of(r)) + ">";
      std::printf("  %-36s %s\n", key.c_str(), r.help);
    }
    std::cout << std::flush;
    return load_result::exit_ok;
  }
  // One read of the file serves both the linter and CAF's parser.
  std::stringstream ini;
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) throw std::runtime_error("cannot open config file " + config_file);
    ini << in.rdbuf();
    auto problems = check_ini(ini.str(), config_file, cfg.schema());
    if (!problems.empty()) {
      for (auto& p : problems) std::cerr << to_string(p) << "\n";
      std::cerr << program << ": " << problems.size() << " problem(s) in " << config_file << "\n";
      return load_result::exit_usage;
    }
  }
  if (auto err = cfg.parse(args, ini)) {
    report_cli_error(program, cfg, args, cfg.render(err));
    return load_result::exit_usage;
  }
  return cfg.cli_helptext_printed ? load_result::exit_ok : load_result::run;
}

}  // namespace fusion
