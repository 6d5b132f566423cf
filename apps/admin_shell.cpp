#include "apps/admin_shell.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "core/graph_names.hpp"

namespace fusion::admin {

namespace {

using nlohmann::json;

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_blank(s[b])) ++b;
  while (e > b && is_blank(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string printf_string(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Field access that never throws: a coordinator of another build may leave fields out or send
// null where no value exists yet (no loss before the first step).
const json* field(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

/// A field as text: strings as they are, integers without decimals, reals with `fmt`.
std::string text(const json& j, const char* key, const char* fmt = "%.2f") {
  auto* v = field(j, key);
  if (!v) return "-";
  if (v->is_string()) return v->get<std::string>().empty() ? "-" : v->get<std::string>();
  if (v->is_boolean()) return v->get<bool>() ? "yes" : "no";
  if (v->is_number_integer()) return std::to_string(v->get<int64_t>());
  if (v->is_number()) return printf_string(fmt, v->get<double>());
  return v->dump();
}

/// A numeric field, or NaN.
double number(const json& j, const char* key) {
  auto* v = field(j, key);
  return v && v->is_number() ? v->get<double>() : std::nan("");
}

const json& array_of(const json& j, const char* key) {
  static const json empty = json::array();
  auto* v = field(j, key);
  return v && v->is_array() ? *v : empty;
}

std::string arrow(const json& j, const char* a, const char* b) { return text(j, a) + " -> " + text(j, b); }

std::string bytes_text(const json& j, const char* key) {
  double b = number(j, key);
  return std::isnan(b) ? "-" : format_bytes(b);
}

std::string render_status(const json& r) {
  std::vector<std::vector<std::string>> rows = {
      {"phase", text(r, "phase")},
      {"step", text(r, "step") + "/" + text(r, "steps")},
      {"loss", text(r, "loss", "%.4f")},
      {"tokens/s", text(r, "tokens_per_s", "%.0f")},
      // No rate yet (before the first step): no estimate either, whatever eta_s says.
      {"ETA", number(r, "tokens_per_s") == 0 ? "-" : format_duration(number(r, "eta_s"))},
      {"elapsed", format_duration(number(r, "elapsed_s"))},
      {"model", text(r, "model")},
      {"cluster", text(r, "cluster")},
  };
  if (auto f = text(r, "failure"); f != "-") rows.push_back({"failure", f});
  if (auto v = text(r, "scheduler"); v != "-") rows.push_back({"scheduler", v});  // the last verdict
  return format_table({}, rows);
}

std::string render_nodes(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (auto& n : array_of(r, "nodes")) {
    // 0 means not measured (the coordinator's own process in a one-process run).
    double gflops = number(n, "gflops"), mem = number(n, "memory_bytes");
    rows.push_back({text(n, "name"), text(n, "site"), text(n, "device"),
                    gflops > 0 ? printf_string("%.1f", gflops) : "-",
                    mem > 0 ? printf_string("%.1f", mem / double(1 << 30)) : "-", text(n, "state")});
  }
  if (rows.empty()) return "no nodes\n";
  return format_table({"name", "site", "device", "GFLOP/s", "memory GiB", "state"}, rows,
                      {false, false, false, true, true, false});
}

std::string render_placement(const json& r) {
  std::string out = "policy: " + text(r, "policy") + "\n";
  // Consecutive ops on one node collapse into one row: a model has hundreds of ops but only a
  // few stage boundaries, and those are what a reader looks for.
  std::vector<std::vector<std::string>> runs;
  std::string first, last, node;
  size_t count = 0;
  auto flush = [&] {
    if (count) runs.push_back({count == 1 ? first : first + " .. " + last, std::to_string(count), node});
  };
  for (auto& o : array_of(r, "ops")) {
    auto op = text(o, "op"), n = text(o, "node");
    if (count && n == node) {
      last = op;
      ++count;
      continue;
    }
    flush();
    first = last = op;
    node = n;
    count = 1;
  }
  flush();
  out += runs.empty() ? "no ops placed\n" : format_table({"ops", "count", "node"}, runs, {false, true, false});
  std::vector<std::vector<std::string>> edges;
  for (auto& e : array_of(r, "edges"))
    edges.push_back({text(e, "id"), text(e, "dir"), arrow(e, "producer", "consumer"), arrow(e, "from", "to"),
                     bytes_text(e, "bytes_per_micro_batch"), bytes_text(e, "wire_bytes_per_micro_batch"),
                     text(e, "codec")});
  if (edges.empty()) return out + "edges: none cross a process boundary\n";
  return out + "edges:\n" +
         format_table({"id", "dir", "producer -> consumer", "from -> to", "bytes", "on wire", "codec"}, edges,
                      {true, false, false, false, true, true, false});
}

std::string render_ops(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (auto& o : array_of(r, "ops"))
    rows.push_back({text(o, "op"), text(o, "node"), text(o, "fwd_ms"), text(o, "bwd_ms")});
  std::string out = "step " + text(r, "step") + "\n";
  if (rows.empty()) return out + "no op timings yet\n";
  return out + format_table({"op", "node", "fwd ms", "bwd ms"}, rows, {false, false, true, true});
}

std::string render_links(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (auto& e : array_of(r, "edges"))
    rows.push_back({text(e, "id"), text(e, "dir"), arrow(e, "producer", "consumer"), arrow(e, "from", "to"),
                    bytes_text(e, "dense_bytes"), bytes_text(e, "bytes"), text(e, "keep_ratio", "%.3g"),
                    text(e, "mbit_s", "%.1f")});
  std::string out = "step " + text(r, "step") + "\n";
  if (rows.empty()) return out + "no cross-process traffic in the last step\n";
  return out + format_table({"edge", "dir", "producer -> consumer", "from -> to", "bytes", "on wire", "keep", "Mbit/s"},
                            rows, {true, false, false, false, true, true, true, true});
}

std::string render_generic(const json& r) {
  if (!r.is_object()) return r.dump() + "\n";
  if (r.empty()) return "ok\n";
  std::vector<std::vector<std::string>> rows;
  for (auto it = r.begin(); it != r.end(); ++it)
    rows.push_back({it.key(), it->is_string() ? it->get<std::string>() : it->dump()});
  return format_table({}, rows);
}

}  // namespace

const std::vector<command_spec>& commands() {
  using k = command_kind;
  static const std::vector<command_spec> table = {
      {"status", k::query, 0, 0, "status", "phase, step, loss, tokens/s and ETA of the run"},
      {"nodes", k::query, 0, 0, "nodes", "the nodes: site, device, measured GFLOP/s, memory, state"},
      {"placement", k::query, 0, 0, "placement", "which node runs each op, and the edges between processes"},
      {"ops", k::query, 0, 0, "ops", "forward and backward milliseconds of every op in the last step"},
      {"links", k::query, 0, 0, "links", "bytes and Mbit/s of every cross-process edge in the last step"},
      {"pause", k::verb, 0, 0, "pause", "let the step in flight finish, then hold the run"},
      {"resume", k::verb, 0, 0, "resume", "continue a paused run"},
      {"move", k::verb, 2, 2, "move OP|GLOB NODE", "move ops with their state to another node (at the step boundary)"},
      {"replicas", k::verb, 2, 2, "replicas OP NODE[,NODE...]",
       "the nodes holding OP's stage: add, drop or move replicas (at the step boundary)"},
      {"drain", k::verb, 1, 1, "drain NODE", "move every op off a node (at the step boundary), then let it leave"},
      {"plan", k::verb, 0, 0, "plan", "what the scheduler would do now, and why"},
      {"rebalance", k::verb, 0, 1, "rebalance [-y]", "show the re-planned move; apply it after confirmation (-y: at once)"},
      {"compress", k::verb, 2, 2, "compress EDGE none|RATIO|auto", "the codec of one edge (id from 'placement')"},
      {"checkpoint", k::verb, 0, 1, "checkpoint [FILE]", "write a checkpoint at the step boundary"},
      {"scheduler", k::verb, 0, 1, "scheduler [on|off]", "the live scheduler's settings; turn it on or off"},
      {"set", k::verb, 1, 1, "set KEY=VALUE", "change a scheduler setting, e.g. set scheduler.every=5"},
      {"help", k::help, 0, 1, "help [COMMAND]", "this list, or one command"},
      {"quit", k::quit, 0, 0, "quit", "leave the shell (also: exit, Ctrl-D)"},
      {"exit", k::quit, 0, 0, "exit", "leave the shell"},
  };
  return table;
}

std::vector<std::string> command_names(command_kind kind) {
  std::vector<std::string> out;
  for (auto& c : commands())
    if (c.kind == kind) out.push_back(c.name);
  return out;
}

const command_spec* find_command(std::string_view name) {
  for (auto& c : commands())
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> split_commands(std::string_view line) {
  std::vector<std::string> out;
  std::string cur;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      cur += c;
      if (c == quote) quote = 0;
      // Inside double quotes a backslash still escapes (tokenize treats it the same way).
      else if (c == '\\' && quote == '"' && i + 1 < line.size()) cur += line[++i];
    } else if (c == '\\' && i + 1 < line.size()) {
      cur += c;
      cur += line[++i];
    } else if (c == ';') {
      if (auto t = trim(cur); !t.empty()) out.push_back(t);
      cur.clear();
    } else {
      if (c == '\'' || c == '"') quote = c;
      cur += c;
    }
  }
  if (quote) throw std::runtime_error(std::string("unterminated ") + quote + " quote");
  if (auto t = trim(cur); !t.empty()) out.push_back(t);
  return out;
}

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> words;
  std::string cur;
  bool has_word = false;  // "" is an empty word, not nothing
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
      else cur += c;
    } else if (c == '\\' && i + 1 < text.size()) {
      cur += text[++i];
      has_word = true;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
      else cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      has_word = true;
    } else if (is_blank(c)) {
      if (has_word) words.push_back(std::move(cur));
      cur.clear();
      has_word = false;
    } else {
      cur += c;
      has_word = true;
    }
  }
  if (quote) throw std::runtime_error(std::string("unterminated ") + quote + " quote");
  if (has_word) words.push_back(std::move(cur));
  return words;
}

status check_command(const std::vector<std::string>& words) {
  if (words.empty()) return fail("empty command");
  std::vector<std::string> names;
  for (auto& c : commands()) names.push_back(c.name);
  auto* spec = find_command(words[0]);
  if (!spec)
    return fail("unknown command '" + words[0] + "'" + did_you_mean(words[0], names) + "; 'help' lists the commands");
  size_t n = words.size() - 1;
  if (n < spec->min_args || n > spec->max_args) {
    std::string what;
    if (spec->max_args == 0) what = "takes no arguments";
    else if (spec->min_args == spec->max_args)
      what = "needs " + std::to_string(spec->min_args) + (spec->min_args == 1 ? " argument" : " arguments");
    else what = "takes at most " + std::to_string(spec->max_args) + (spec->max_args == 1 ? " argument" : " arguments");
    return fail("'" + spec->name + "' " + what + " (usage: " + spec->usage + ")");
  }
  if (spec->kind == command_kind::help && n == 1 && !find_command(words[1]))
    return fail("help: unknown command '" + words[1] + "'" + did_you_mean(words[1], names));
  return {};
}

parsed_line parse_line(std::string_view line) {
  parsed_line out;
  auto t = trim(line);
  if (t.empty() || t[0] == '#') return out;
  try {
    for (auto& piece : split_commands(t)) {
      auto words = tokenize(piece);
      if (words.empty()) continue;
      if (auto known = check_command(words); !known) {
        out.commands.clear();
        out.error = known.error();
        return out;
      }
      command c;
      c.spec = find_command(words[0]);
      c.name = words[0];
      c.args.assign(words.begin() + 1, words.end());
      out.commands.push_back(std::move(c));
    }
  } catch (const std::exception& e) {
    out.commands.clear();
    out.error = e.what();
  }
  return out;
}

std::string help_text(std::string_view topic) {
  std::vector<std::vector<std::string>> rows;
  for (auto& c : commands()) {
    if (!topic.empty() && c.name != topic) continue;
    rows.push_back({c.usage, c.summary});
  }
  std::string out = format_table({}, rows);
  if (topic.empty())
    out += "Separate commands with ';'. Queries are read-only; the other commands change the run and are\n"
           "checked by the coordinator, which says why when it refuses one.\n";
  return out;
}

std::vector<std::string> completions(std::string_view prefix) {
  std::vector<std::string> out;
  for (auto& c : commands())
    if (c.name.compare(0, prefix.size(), prefix) == 0) out.push_back(c.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> completions_in(std::string_view before, std::string_view prefix) {
  // A stand-in for the word being completed shows where it stands in its command.
  std::vector<std::string> words;
  try {
    words = tokenize(split_commands(std::string(before) + "x").back());
  } catch (const std::exception&) {
    return {};  // inside an open quote: an argument
  }
  if (words.size() == 1 || (words.size() == 2 && words[0] == "help")) return completions(prefix);
  return {};
}

std::string format_bytes(double bytes) {
  if (bytes < 1024) return printf_string("%.0f B", bytes);
  if (bytes < 1024.0 * 1024) return printf_string("%.1f KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return printf_string("%.1f MiB", bytes / (1024.0 * 1024));
  return printf_string("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

std::string render(std::string_view name, const nlohmann::json& reply) {
  if (name == "status") return render_status(reply);
  if (name == "nodes") return render_nodes(reply);
  if (name == "placement") return render_placement(reply);
  if (name == "ops") return render_ops(reply);
  if (name == "links") return render_links(reply);
  // pause and resume answer with the run's status: show it the way `status` does.
  if (field(reply, "phase") && field(reply, "steps")) return render_status(reply);
  return render_generic(reply);
}

std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right) {
  std::vector<size_t> width(header.size());
  for (auto& r : rows)
    if (r.size() > width.size()) width.resize(r.size());
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  };
  widen(header);
  for (auto& r : rows) widen(r);
  std::string out;
  auto line = [&](const std::vector<std::string>& r) {
    std::string l;
    for (size_t i = 0; i < r.size(); ++i) {
      size_t pad = width[i] - r[i].size();
      bool align_right = i < right.size() && right[i];
      if (i) l += "  ";
      if (align_right) l.append(pad, ' ');
      l += r[i];
      if (!align_right && i + 1 < r.size()) l.append(pad, ' ');
    }
    out += l + "\n";
  };
  if (!header.empty()) line(header);
  for (auto& r : rows) line(r);
  return out;
}

}  // namespace fusion::admin
