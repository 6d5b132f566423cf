// Cluster file loader: protobuf text format -> validated cluster_spec.
//
// Every check throws cluster_error "FILE:LINE: message" on the first problem, with the line of
// the offending field when the file has it (else the line of its entry), and a did-you-mean for
// misspelt site, node and policy names. Format reference: docs/cluster.md.
#include "core/cluster.hpp"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "base/file_text.hpp"
#include "base/host_port.hpp"
#include "cluster.pb.h"
#include "core/graph_names.hpp"
#include "core/text_format.hpp"
#include "tensor/device.hpp"

namespace fusion {

const std::vector<std::string>& placement_policy_names() {
  static const std::vector<std::string> names{"opfence", "even", "explicit", "opfence-replicas"};
  return names;
}

std::optional<placement_policy> find_placement_policy(const std::string& name) {
  const auto& names = placement_policy_names();
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) return std::nullopt;
  return static_cast<placement_policy>(it - names.begin());
}

int cluster_spec::find_site(const std::string& n) const {
  for (size_t i = 0; i < sites.size(); ++i)
    if (sites[i].name == n) return static_cast<int>(i);
  return -1;
}

size_t cluster_spec::required_nodes() const {
  size_t n = 0;
  for (auto& node : nodes) n += !node.spare;
  return n;
}

int cluster_spec::find_node(const std::string& n) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == n) return static_cast<int>(i);
  return -1;
}

double cluster_spec::link_mbit(const std::string& site_a, const std::string& site_b) const {
  for (auto* s : {&site_a, &site_b})
    if (find_site(*s) < 0) throw cluster_error(file + ": link_mbit: unknown site '" + *s + "'");
  if (site_a == site_b) return std::numeric_limits<double>::infinity();
  for (auto& l : links)
    if ((l.a == site_a && l.b == site_b) || (l.a == site_b && l.b == site_a)) return l.mbit;
  return std::numeric_limits<double>::infinity();
}

namespace {
constexpr double min_link_mbit = 0.001, max_link_mbit = 1e7;
}  // namespace

std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what) {
  auto split = split_host_port(text);
  if (!split) throw std::runtime_error(what + ": " + split.error());
  return std::move(*split);
}

double cluster_spec::node_link_mbit(int node_a, int node_b) const {
  return link_mbit(nodes.at(node_a).site, nodes.at(node_b).site);
}

std::vector<std::string> cluster_spec::firewalled_nodes() const {
  std::vector<std::string> out;
  for (auto& n : nodes)
    if (!n.accept_inbound) out.push_back(n.name);
  return out;
}

namespace {

namespace gp = google::protobuf;
using info_tree = text_format::info_tree;
using text_format::line_of;
using text_format::nested;


// Site and node names end up in namespace names, shell words and actor names: letters, digits,
// '_' and '-', starting with a letter or '_'.
bool is_cluster_name(const std::string& n) {
  if (n.empty() || n.size() > 32 || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

class cluster_loader {
 public:
  explicit cluster_loader(const std::string& path) : path_(path) {}

  cluster_spec run(const std::string& text) {
    parse(text);
    spec_.file = path_;
    spec_.name = file_.name();
    coordinator();
    sites();
    nodes();
    links();
    placement();
    spares();
    return std::move(spec_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw cluster_error(path_ + ":" + std::to_string(line) + ": " + msg);
  }

  void parse(const std::string& text) {
    if (auto parsed = text_format::parse(text, file_, tree_, "cluster file"); !parsed)
      throw cluster_error(path_ + ":" + parsed.error());
  }

  void coordinator() {
    if (!file_.has_coordinator()) return;
    auto* d = pb::cluster::descriptor();
    auto* cd = pb::cluster_coordinator::descriptor();
    int line = line_of(&tree_, d, "coordinator", -1, 1);
    auto* t = nested(&tree_, d, "coordinator");
    const auto& c = file_.coordinator();
    if (!c.host().empty()) {
      bool blank = std::any_of(c.host().begin(), c.host().end(), [](char ch) { return std::isspace(static_cast<unsigned char>(ch)); });
      if (blank) fail(line_of(t, cd, "host", -1, line), "coordinator host '" + c.host() + "' contains white space");
      spec_.coordinator_host = c.host();
    }
    if (c.port() < 0 || c.port() > 65535)
      fail(line_of(t, cd, "port", -1, line),
           "coordinator port must be 0 (any free port) or 1..65535, got " + std::to_string(c.port()));
    spec_.coordinator_port = c.port();
  }

  void sites() {
    auto* d = pb::cluster::descriptor();
    if (file_.site_size() == 0) fail(1, "no sites: add at least one site { name: \"...\" }");
    for (int i = 0; i < file_.site_size(); ++i) {
      const auto& s = file_.site(i);
      int line = line_of(&tree_, d, "site", i, 1);
      check_name(s.name(), "site", line);
      if (int prev = spec_.find_site(s.name()); prev >= 0)
        fail(line, "site '" + s.name() + "' defined twice (first at line " + std::to_string(spec_.sites[prev].line) + ")");
      spec_.sites.push_back({s.name(), line});
    }
  }

  void nodes() {
    auto* d = pb::cluster::descriptor();
    auto* nd = pb::cluster_node::descriptor();
    if (file_.node_size() == 0) fail(1, "no nodes: add at least one node { name: \"...\" site: \"...\" }");
    for (int i = 0; i < file_.node_size(); ++i) {
      const auto& n = file_.node(i);
      int line = line_of(&tree_, d, "node", i, 1);
      auto* t = nested(&tree_, d, "node", i);
      check_name(n.name(), "node", line);
      std::string who = "node '" + n.name() + "': ";
      if (int prev = spec_.find_node(n.name()); prev >= 0)
        fail(line, "node '" + n.name() + "' defined twice (first at line " + std::to_string(spec_.nodes[prev].line) + ")");
      cluster_node out;
      out.name = n.name();
      out.line = line;
      out.site = n.site();
      out.site_index = site_ref(n.site(), line_of(t, nd, "site", -1, line), who + "site");
      if (!n.device().empty()) {
        try {
          // A cluster file names the device exactly: "cuda" alone is refused, not read as cuda:0.
          if (n.device() == "cuda") throw std::runtime_error("ambiguous");
          out.device = normalize_device(n.device());
          out.cuda_device = cuda_index_of(out.device);
        } catch (const std::runtime_error&) {
          fail(line_of(t, nd, "device", -1, line),
               who + "bad device '" + n.device() + "' (use \"cpu\" or \"cuda:N\", e.g. \"cuda:0\")");
        }
      }
      // Optional numbers: each must be positive and finite when present.
      auto positive = [&](const char* field, double v, double max, const char* example) {
        if (line_of(t, nd, field) == 0) return 0.0;
        if (!(v > 0) || !(v <= max)) {
          std::ostringstream text;
          text << v;
          fail(line_of(t, nd, field, -1, line), who + field + " must be > 0 and <= " + std::to_string(static_cast<long long>(max)) +
                                                   ", got " + text.str() + " (e.g. " + example + ")");
        }
        return v;
      };
      out.cpu_share = positive("cpu_share", n.cpu_share(), 64, "cpu_share: 0.5 for half a core");
      out.gflops = positive("gflops", n.gflops(), 1e7, "gflops: 60000 for an H100's fp32 tensor-core rate");
      out.memory_gib = positive("memory_gib", n.memory_gib(), 1e6, "memory_gib: 80");
      out.accept_inbound = line_of(t, nd, "accept_inbound") == 0 || n.accept_inbound();
      spec_.nodes.push_back(std::move(out));
    }
  }

  void links() {
    auto* d = pb::cluster::descriptor();
    auto* ld = pb::cluster_link::descriptor();
    std::map<std::pair<std::string, std::string>, int> seen;  // sorted site pair -> line
    for (int i = 0; i < file_.link_size(); ++i) {
      const auto& l = file_.link(i);
      int line = line_of(&tree_, d, "link", i, 1);
      auto* t = nested(&tree_, d, "link", i);
      site_ref(l.a(), line_of(t, ld, "a", -1, line), "link: a");
      site_ref(l.b(), line_of(t, ld, "b", -1, line), "link: b");
      if (l.a() == l.b()) fail(line, "link from site '" + l.a() + "' to itself (traffic inside a site is unshaped)");
      auto key = std::minmax(l.a(), l.b());
      auto [it, fresh] = seen.emplace(std::pair{key.first, key.second}, line);
      if (!fresh)
        fail(line, "link between '" + l.a() + "' and '" + l.b() + "' defined twice (first at line " +
                       std::to_string(it->second) + "); links are symmetric");
      int mline = line_of(t, ld, "mbit", -1, line);
      if (line_of(t, ld, "mbit") == 0) fail(line, "link '" + l.a() + "' - '" + l.b() + "': missing 'mbit' (Mbit/s, e.g. mbit: 100)");
      // From 1 kbit/s (tc's rates stop being exact below it, and a plan's step would last days) to
      // 10 Tbit/s; a site pair without a link is unshaped.
      if (!(l.mbit() >= min_link_mbit && l.mbit() <= max_link_mbit)) {
        std::ostringstream v;
        v << l.mbit();
        fail(mline, "link '" + l.a() + "' - '" + l.b() + "': mbit must be from 0.001 (1 kbit/s) to 10000000, got " + v.str() +
                        " (leave a site pair without a link for unshaped)");
      }
      spec_.links.push_back({l.a(), l.b(), l.mbit(), line});
    }
  }

  void placement() {
    auto* d = pb::cluster::descriptor();
    auto* pd = pb::cluster_placement::descriptor();
    auto* ad = pb::cluster_assign::descriptor();
    if (!file_.has_placement()) return;
    const auto& p = file_.placement();
    int line = line_of(&tree_, d, "placement", -1, 1);
    auto* t = nested(&tree_, d, "placement");
    spec_.placement.line = line;
    const auto& names = placement_policy_names();
    if (!p.policy().empty()) {
      auto policy = find_placement_policy(p.policy());
      if (!policy)
        fail(line_of(t, pd, "policy", -1, line), "unknown placement policy '" + p.policy() + "'" +
                                                     did_you_mean(p.policy(), names) + "; known: " + join(names));
      spec_.placement.policy = *policy;
    }
    bool is_explicit = spec_.placement.policy == placement_policy::explicit_ops;
    if (!is_explicit && p.assign_size() > 0)
      fail(line_of(t, pd, "assign", 0, line), "'assign' entries need policy: \"explicit\" (policy is '" +
                                                  names[static_cast<int>(spec_.placement.policy)] + "')");
    if (is_explicit && p.assign_size() == 0)
      fail(line, "policy \"explicit\" needs assign { node: \"...\" ops: \"...\" } entries");
    for (int i = 0; i < p.assign_size(); ++i) {
      const auto& a = p.assign(i);
      int aline = line_of(t, pd, "assign", i, line);
      auto* at = nested(t, pd, "assign", i);
      cluster_assign out;
      out.node = a.node();
      out.line = aline;
      int nline = line_of(at, ad, "node", -1, aline);
      if (a.node().empty()) fail(aline, "assign: missing 'node'");
      out.node_index = spec_.find_node(a.node());
      if (out.node_index < 0)
        fail(nline, "assign: unknown node '" + a.node() + "'" + did_you_mean(a.node(), node_names()) +
                        "; nodes: " + join(node_names()));
      for (auto& prev : spec_.placement.assigns) {
        if (prev.node == a.node())
          fail(aline, "assign: node '" + a.node() + "' already has an assign at line " + std::to_string(prev.line) +
                          "; list all its ops in one assign");
        for (size_t r = 0; r < prev.replicas.size(); ++r)
          if (prev.replicas[r] == a.node())
            fail(nline, "assign: node '" + a.node() + "' is already a replica of node '" + prev.node + "' (line " +
                            std::to_string(prev.replica_lines[r]) + "); a node holds one stage");
      }
      for (int k = 0; k < a.replica_size(); ++k) {
        const std::string& name = a.replica(k);
        int rline = line_of(at, ad, "replica", k, aline);
        if (name.empty()) fail(rline, "assign for node '" + a.node() + "': empty replica entry");
        int index = spec_.find_node(name);
        if (index < 0)
          fail(rline, "assign for node '" + a.node() + "': unknown replica node '" + name + "'" +
                          did_you_mean(name, node_names()) + "; nodes: " + join(node_names()));
        if (name == a.node())
          fail(rline, "assign for node '" + a.node() + "': node '" + name +
                          "' twice in one stage (it is the assign's node; a replica must be another node)");
        for (size_t r = 0; r < out.replicas.size(); ++r)
          if (out.replicas[r] == name)
            fail(rline, "assign for node '" + a.node() + "': replica '" + name + "' twice in one stage (first at line " +
                            std::to_string(out.replica_lines[r]) + ")");
        for (auto& prev : spec_.placement.assigns) {
          if (prev.node == name)
            fail(rline, "assign for node '" + a.node() + "': replica '" + name + "' already has an assign at line " +
                            std::to_string(prev.line) + "; a node holds one stage");
          for (size_t r = 0; r < prev.replicas.size(); ++r)
            if (prev.replicas[r] == name)
              fail(rline, "assign for node '" + a.node() + "': replica '" + name + "' is already a replica of node '" +
                              prev.node + "' (line " + std::to_string(prev.replica_lines[r]) + "); a node holds one stage");
        }
        out.replicas.push_back(name);
        out.replica_indices.push_back(index);
        out.replica_lines.push_back(rline);
      }
      if (a.ops_size() == 0) fail(aline, "assign for node '" + a.node() + "' has no ops (ops: \"NAME\" or a glob like \"h0.*\")");
      for (int k = 0; k < a.ops_size(); ++k) {
        int oline = line_of(at, ad, "ops", k, aline);
        if (a.ops(k).empty()) fail(oline, "assign for node '" + a.node() + "': empty ops entry");
        out.ops.push_back(a.ops(k));
        out.op_lines.push_back(oline);
      }
      spec_.placement.assigns.push_back(std::move(out));
    }
  }

  // `spare: "NAME"` entries: nodes of the file the run does not wait for at start.
  void spares() {
    auto* d = pb::cluster::descriptor();
    for (int i = 0; i < file_.spare_size(); ++i) {
      const std::string& name = file_.spare(i);
      const int line = line_of(&tree_, d, "spare", i, 1);
      if (name.empty()) fail(line, "spare: empty node name (spare: \"NAME\" names a node entry of this file)");
      const int index = spec_.find_node(name);
      if (index < 0)
        fail(line, "spare: unknown node '" + name + "'" + did_you_mean(name, node_names()) +
                       "; a spare names a node entry of this file (nodes: " + join(node_names()) + ")");
      auto& n = spec_.nodes[index];
      if (n.spare) fail(line, "spare: node '" + name + "' listed twice (first at line " + std::to_string(n.spare_line) + ")");
      for (auto& a : spec_.placement.assigns) {
        bool named = a.node_index == index;
        for (int r : a.replica_indices) named = named || r == index;
        if (named)
          fail(line, "spare: node '" + name + "' is named by the explicit assign at line " + std::to_string(a.line) +
                         ": a spare may be absent at start, so the placement cannot count on it");
      }
      n.spare = true;
      n.spare_line = line;
    }
    if (!spec_.nodes.empty() && spec_.required_nodes() == 0)
      fail(line_of(&tree_, d, "spare", 0, 1), "every node is a spare: the run needs at least one node to start on");
  }

  void check_name(const std::string& n, const char* what, int line) const {
    if (n.empty()) fail(line, std::string(what) + ": missing 'name'");
    if (!is_cluster_name(n))
      fail(line, std::string(what) + " '" + n + "': bad name (1-32 letters, digits, '_' and '-', starting with a letter or '_')");
  }

  // Index of site `name` referenced from `who`, or fail with a did-you-mean.
  int site_ref(const std::string& name, int line, const std::string& who) const {
    if (name.empty()) fail(line, who + ": missing site name");
    int s = spec_.find_site(name);
    if (s < 0) fail(line, who + ": unknown site '" + name + "'" + did_you_mean(name, site_names()) + "; sites: " + join(site_names()));
    return s;
  }

  std::vector<std::string> site_names() const {
    std::vector<std::string> out;
    for (auto& s : spec_.sites) out.push_back(s.name);
    return out;
  }

  std::vector<std::string> node_names() const {
    std::vector<std::string> out;
    for (auto& n : spec_.nodes) out.push_back(n.name);
    return out;
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
  }

  std::string path_;
  pb::cluster file_;
  info_tree tree_;
  cluster_spec spec_;
};

}  // namespace

cluster_spec parse_cluster(const std::string& text, const std::string& path) {
  return cluster_loader(path).run(text);
}

cluster_spec load_cluster(const std::string& path) {
  auto text = read_file_text(path, "cluster file");
  if (!text) throw cluster_error(text.error());
  return parse_cluster(*text, path);
}

}  // namespace fusion
