// Profile files: a cluster_profile as JSON, so that a restart (or fusion-cluster plan) can use
// what an earlier run measured instead of measuring again.
//
//   {
//     "format": "fusion-profile", "version": 1,
//     "model": "gpt-char-tiny", "micro_batch": 4,
//     "nodes": {
//       "a1": { "site": "a", "device": "cpu", "gflops": 41.5, "memory_bytes": 8123456512,
//               "cpu_share": 0.98, ("cpu_quota": 0.3, "cpu_period_s": 0.1: a quota below one
//               core; the op times are then CPU times, docs/scheduler.md)
//               "ops": { "linear{out=256}(4x64x64)": { "forward_s": 1.2e-4, "backward_s": 2.5e-4,
//                                                     "update_s": 3.1e-5 }, ... } }, ...
//     },
//     "links": [ { "a": "a", "b": "b", "mbit": 9400.5, "rtt_s": 6.1e-5, "measured": true } ]
//   }
//
// Nodes are keyed by name and links name their sites, so a file stays valid when the cluster
// file is reordered. Unmeasured links are saved for readers such as fusion-cluster plan, but on
// loading the cluster file's current rate replaces them (it is the hint they were copied from).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/file_text.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* format_marker = "fusion-profile";
constexpr int format_version = 1;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// Reads fields of one file and says what is wrong with them naming the file and the field.
class profile_reader {
 public:
  profile_reader(std::string file, const cluster_spec& c) : file_(std::move(file)), cluster_(c) {}

  [[noreturn]] void fail(const std::string& message) const { throw profile_error(file_ + ": " + message); }

  const json& member(const json& obj, const std::string& key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(where + " has no \"" + key + "\"");
    return *it;
  }

  const json& object(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = member(obj, key, where);
    if (!v.is_object()) fail(path(where, key) + " must be an object, got " + v.type_name());
    return v;
  }

  std::string string(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = member(obj, key, where);
    if (!v.is_string()) fail(path(where, key) + " must be a string, got " + v.type_name());
    return v.get<std::string>();
  }

  // A number that must not be negative (rates, times, sizes); `positive` refuses 0 too.
  double rate(const json& obj, const std::string& key, const std::string& where, bool positive = false) const {
    const json& v = member(obj, key, where);
    if (!v.is_number()) fail(path(where, key) + " must be a number, got " + v.type_name());
    double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (positive && x == 0))
      fail(path(where, key) + " is " + v.dump() + ": it must be " + (positive ? "more than 0" : "0 or more"));
    return x;
  }

  double rate_or(const json& obj, const std::string& key, const std::string& where, double fallback) const {
    return obj.contains(key) ? rate(obj, key, where) : fallback;
  }

  static std::string path(const std::string& where, const std::string& key) {
    return where == "the profile" ? "\"" + key + "\"" : where + "." + key;
  }

  const std::string& file() const { return file_; }
  const cluster_spec& cluster() const { return cluster_; }

 private:
  std::string file_;
  const cluster_spec& cluster_;
};

std::string site_list(const cluster_spec& c) {
  std::string out;
  for (auto& s : c.sites) out += (out.empty() ? "" : ", ") + s.name;
  return out;
}

// nlohmann's "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error
// while parsing object key - invalid literal; last read: '{ o'; expected string literal" in plain
// words: "at line 3, column 7: found 'o' where a key in double quotes belongs".
std::string parse_error_text(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  std::string at = "at byte " + std::to_string(e.byte);
  if (auto l = what.find(" at line "); l != std::string::npos) at = what.substr(l + 1, what.find(':', l) - l - 1);
  // What belongs there, from the parser's context ("while parsing object key - ...").
  static const std::map<std::string, std::string> belongs = {
      {"object key", "a key in double quotes"},
      {"object separator", "':' after the key"},
      {"object", "',' or '}'"},
      {"array", "',' or ']'"},
      {"value", "a value (a number, a string in double quotes, true, false, null, an object or an array)"}};
  std::string expected = "valid JSON";
  if (auto p = what.find("while parsing "); p != std::string::npos) {
    auto it = belongs.find(what.substr(p + 14, what.find(" - ", p) - p - 14));
    if (it != belongs.end()) expected = it->second;
  }
  if (what.find("; expected end of input") != std::string::npos) expected = "the end of the file (the JSON object has ended)";
  // What the parser found: a token it could not read ("last read: '...'"), or a token in the
  // wrong place ("unexpected '}'").
  std::string found = "something else";
  const auto last = what.find("; last read: '");
  if (what.find("- unexpected end of input") != std::string::npos) {
    found = "the end of the file";
  } else if (last != std::string::npos) {
    const size_t from = last + 14, to = what.find("'; expected", from);
    std::string token = what.substr(from, (to == std::string::npos ? what.rfind('\'') : to) - from);
    const size_t dash = what.find(" - ");
    const std::string reason = dash == std::string::npos ? "" : what.substr(dash + 3, last - dash - 3);
    // The lexer's token runs from its last reset: "{ o" for the literal "o" after the brace.
    if (reason == "invalid literal") token = token.substr(token.find_last_of(" \t\r\n{[,:") + 1);
    found = "'" + token + "'";
    if (reason.rfind("invalid string: ", 0) == 0) found = "a malformed string (" + reason.substr(16) + ")";
    else if (reason.rfind("invalid number", 0) == 0) found += ", a malformed number";
  } else if (auto u = what.find("unexpected "); u != std::string::npos) {
    found = what.substr(u + 11, what.find(';', u) == std::string::npos ? std::string::npos : what.find(';', u) - u - 11);
    if (found == "string literal") found = "a string";
    if (found == "number literal") found = "a number";
  }
  return at + ": found " + found + " where " + expected + " belongs";
}

node_profile read_node(const profile_reader& r, const json& j, const cluster_node& cn) {
  const std::string where = "nodes." + cn.name;
  if (!j.is_object()) r.fail(where + " must be an object, got " + std::string(j.type_name()));
  node_profile n;
  n.name = cn.name;
  n.site = r.string(j, "site", where);
  if (r.cluster().find_site(n.site) < 0)
    r.fail(where + ".site: unknown site " + in_quotes(n.site) + " (cluster file " + r.cluster().file + " has sites " +
           site_list(r.cluster()) + ")");
  if (n.site != cn.site)
    r.fail(where + ".site is " + in_quotes(n.site) + " but cluster file " + r.cluster().file + " puts node " +
           in_quotes(cn.name) + " on site " + in_quotes(cn.site));
  n.device = j.contains("device") ? r.string(j, "device", where) : cn.device;
  if (!same_device(n.device, cn.device))
    r.fail(where + ".device is " + in_quotes(n.device) + " but cluster file " + r.cluster().file + " gives node " +
           in_quotes(cn.name) + " device " + in_quotes(cn.device));
  n.gflops = r.rate_or(j, "gflops", where, 0);
  double mem = r.rate_or(j, "memory_bytes", where, 0);
  if (mem != std::floor(mem) || mem > 1.8e19) r.fail(where + ".memory_bytes must be a whole number of bytes");
  n.memory_bytes = static_cast<uint64_t>(mem);
  n.cpu_share = r.rate_or(j, "cpu_share", where, 0);
  n.quota.cores = r.rate_or(j, "cpu_quota", where, 0);
  n.quota.period_s = r.rate_or(j, "cpu_period_s", where, 0);
  // The kernel's own bounds for a CFS period: 1 ms to 1 s.
  if (n.quota.cores > 0 && !(n.quota.period_s >= 1e-3 && n.quota.period_s <= 1))
    r.fail(where + ".cpu_period_s is " + json(n.quota.period_s).dump() +
           ": a node with a cpu_quota needs the quota's period, 0.001 to 1 s (the kernel's CFS bounds)");
  if (j.contains("ops")) {
    const json& ops = r.object(j, "ops", where);
    for (auto& [key, t] : ops.items()) {
      const std::string op_where = where + ".ops[\"" + key + "\"]";
      if (!t.is_object()) r.fail(op_where + " must be an object, got " + std::string(t.type_name()));
      op_timing ot;
      ot.forward_s = r.rate(t, "forward_s", op_where);
      ot.backward_s = r.rate(t, "backward_s", op_where);
      ot.update_s = r.rate_or(t, "update_s", op_where, 0);
      n.ops[key] = ot;
    }
  }
  return n;
}

}  // namespace

void save_profile(const std::string& path, const cluster_profile& p) {
  json j;
  j["format"] = format_marker;
  j["version"] = format_version;
  j["model"] = p.model;
  j["micro_batch"] = p.micro_batch;
  json nodes = json::object();
  std::vector<std::string> site_of_index;
  for (auto& n : p.nodes) {
    json jn;
    jn["site"] = n.site;
    jn["device"] = n.device;
    jn["gflops"] = n.gflops;
    jn["memory_bytes"] = n.memory_bytes;
    jn["cpu_share"] = n.cpu_share;
    if (n.quota.cores > 0) {
      jn["cpu_quota"] = n.quota.cores;
      jn["cpu_period_s"] = n.quota.period_s;
    }
    json ops = json::object();
    for (auto& [key, t] : n.ops)
      ops[key] = json{{"forward_s", t.forward_s}, {"backward_s", t.backward_s}, {"update_s", t.update_s}};
    jn["ops"] = std::move(ops);
    nodes[n.name] = std::move(jn);
  }
  j["nodes"] = std::move(nodes);
  json links = json::array();
  for (auto& l : p.links) {
    auto name_of = [&](int site) -> std::string {
      if (site >= 0 && static_cast<size_t>(site) < p.site_names.size()) return p.site_names[site];
      throw profile_error(path + ": cannot save link between site indices " + std::to_string(l.site_a) + " and " +
                          std::to_string(l.site_b) + ": the profile has no names for them");
    };
    links.push_back(json{{"a", name_of(l.site_a)},
                         {"b", name_of(l.site_b)},
                         {"mbit", l.mbit},
                         {"rtt_s", l.rtt_s},
                         {"measured", l.measured}});
  }
  j["links"] = std::move(links);
  std::ofstream out(path);
  if (!out) throw profile_error(path + ": cannot write the profile: " + std::strerror(errno));
  out << j.dump(2) << "\n";
  out.close();
  if (!out) throw profile_error(path + ": cannot write the profile: " + std::strerror(errno));
}

cluster_profile load_profile(const std::string& path, const cluster_spec& c) {
  profile_reader r(path, c);
  auto text = read_file_text(path, "profile");
  if (!text) throw profile_error(text.error());
  json j;
  try {
    j = json::parse(*text);
  } catch (const nlohmann::json::parse_error& e) {
    r.fail("malformed JSON " + parse_error_text(e));
  } catch (const nlohmann::json::exception&) {
    // The parser's other refusal: a number beyond a double's range (out_of_range 406).
    r.fail("malformed JSON: a number in it is too large for a double");
  }
  if (!j.is_object()) r.fail(std::string("a profile is a JSON object, got ") + j.type_name());
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != format_marker)
    r.fail(std::string("not a FusionLLM profile: \"format\" must be \"") + format_marker + "\"" +
           (j.contains("format") ? ", got " + j["format"].dump() : ", and it is missing"));
  const json& version = r.member(j, "version", "the profile");
  if (!version.is_number_integer() || version.get<int64_t>() != format_version)
    r.fail("profile format version " + version.dump() + " is not supported (this build reads version " +
           std::to_string(format_version) + ")");

  cluster_profile p = profile_from_cluster(c);
  if (j.contains("model")) p.model = r.string(j, "model", "the profile");
  p.micro_batch = static_cast<int64_t>(r.rate_or(j, "micro_batch", "the profile", 0));
  const json& nodes = r.object(j, "nodes", "the profile");
  for (auto& [name, jn] : nodes.items())
    if (c.find_node(name) < 0)
      r.fail("nodes." + name + ": node " + in_quotes(name) + " is not in cluster file " + c.file +
             " (a profile of another cluster?)");
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const auto& cn = c.nodes[i];
    auto it = nodes.find(cn.name);
    if (it == nodes.end())
      r.fail("node " + in_quotes(cn.name) + " of cluster file " + c.file + " is missing from \"nodes\"");
    p.nodes[i] = read_node(r, *it, cn);
  }

  if (j.contains("links")) {
    const json& links = r.member(j, "links", "the profile");
    if (!links.is_array()) r.fail(std::string("\"links\" must be an array, got ") + links.type_name());
    std::set<std::pair<int, int>> seen;
    for (size_t k = 0; k < links.size(); ++k) {
      const json& jl = links[k];
      const std::string where = "links[" + std::to_string(k) + "]";
      if (!jl.is_object()) r.fail(where + " must be an object, got " + std::string(jl.type_name()));
      std::string a = r.string(jl, "a", where), b = r.string(jl, "b", where);
      int sa = c.find_site(a), sb = c.find_site(b);
      for (auto& [name, idx] : {std::pair{a, sa}, std::pair{b, sb}})
        if (idx < 0)
          r.fail(where + ": unknown site " + in_quotes(name) + " (cluster file " + c.file + " has sites " +
                 site_list(c) + ")");
      if (sa == sb) r.fail(where + ": a link joins two different sites, got " + in_quotes(a) + " twice");
      if (!seen.insert({std::min(sa, sb), std::max(sa, sb)}).second)
        r.fail(where + ": a second link between sites " + in_quotes(a) + " and " + in_quotes(b));
      link_profile l;
      l.site_a = sa;
      l.site_b = sb;
      l.mbit = r.rate(jl, "mbit", where, true);
      l.rtt_s = r.rate_or(jl, "rtt_s", where, 0);
      const json measured = jl.contains("measured") ? jl["measured"] : json(false);
      if (!measured.is_boolean()) r.fail(where + ".measured must be true or false, got " + measured.dump());
      l.measured = measured.get<bool>();
      // An unmeasured link is the cluster file's hint: the file's current value stands.
      if (!l.measured) continue;
      auto existing = std::find_if(p.links.begin(), p.links.end(), [&](const link_profile& x) {
        return (x.site_a == sa && x.site_b == sb) || (x.site_a == sb && x.site_b == sa);
      });
      if (existing != p.links.end())
        *existing = l;
      else
        p.links.push_back(l);
    }
  }
  return p;
}

}  // namespace fusion
