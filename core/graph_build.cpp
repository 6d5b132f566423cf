// From expanded nodes to the OP-DAG: name resolution, ops, edges, topological order
// (Boost.Graph), shape inference and whole-graph checks.
#include "core/graph_build.hpp"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <boost/graph/topological_sort.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>

#include "base/result.hpp"
#include "core/graph_names.hpp"
#include "core/wire.hpp"

namespace fusion {

namespace {

using bgraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

// Records DFS tree parents and the first back edge, which closes a cycle.
struct cycle_finder : boost::default_dfs_visitor {
  std::vector<size_t>* parent;
  std::pair<size_t, size_t>* back;
  bool* found;
  template <class E, class G>
  void tree_edge(E e, const G& g) const {
    (*parent)[boost::target(e, g)] = boost::source(e, g);
  }
  template <class E, class G>
  void back_edge(E e, const G& g) const {
    if (!*found) *back = {boost::source(e, g), boost::target(e, g)};
    *found = true;
  }
};

std::string describe(const shape_t& s, dtype t) { return to_string(s) + " " + to_string(t); }

// The per-tensor limit is the wire's, counted in f32 elements, so every tensor a model may have can
// also cross a process boundary.
static_assert(graph_max_tensor_elements * 4 == static_cast<int64_t>(wire_max_tensor_bytes));

std::string power_of_two_text(int64_t limit) {
  int bits = 0;
  while ((int64_t{1} << bits) < limit) ++bits;
  return "2^" + std::to_string(bits) + " (" + std::to_string(limit) + ")";
}

// Whether a tensor of shape `s` is allowed; fails saying why not. The product is computed with
// overflow checks: a huge max_len or vocab times the width is exactly what wraps around int64 and
// later sizes a tiny buffer that the kernels overrun.
status tensor_size_allowed(const shape_t& s) {
  bool too_large = false, has_zero = false;
  for (int64_t d : s) {
    if (d < 0) return fail("has a negative dimension");
    too_large |= d > graph_max_tensor_elements;
    has_zero |= d == 0;
  }
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : s) overflow |= __builtin_mul_overflow(n, d, &n);
  if (!too_large && (has_zero || (!overflow && n <= graph_max_tensor_elements))) return {};
  std::string dims;
  for (int64_t d : s) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
  if (s.size() > 1 && !overflow) dims += " = " + std::to_string(n);
  return fail("has " + dims + " elements, more than the limit of " + power_of_two_text(graph_max_tensor_elements) +
              " elements per tensor");
}

// The feeds of a text model and of an image model, in data-source order (core/data_source.hpp).
constexpr std::array<const char*, 2> text_feeds{"tokens", "targets"}, image_feeds{"images", "labels"};

// Ends every size error: where the limits are explained.
const char* const see_limits = "; see \"Limits\" in docs/model-format.md";

class builder {
 public:
  builder(std::vector<pending_node> nodes, const std::vector<graph_alias>& aliases,
          const std::vector<graph_declaration>& decls, const graph_op_table& ops, const std::string& path,
          int64_t batch)
      : nodes_(std::move(nodes)), aliases_(aliases), decls_(decls), ops_(ops), path_(path), batch_(batch) {}

  graph run(const std::string& model_name) {
    index_names();
    make_ops();
    resolve_edges();
    for (auto& d : decls_) declared_.push_back(resolve_declaration(d));
    assign_feeds();
    std::vector<int> order = topo_order();
    infer_shapes(order);
    check_declarations();
    check_dead_ends();
    return insert_fanouts(assemble(order, model_name));
  }

 private:
  [[noreturn]] void fail(int line, const std::string& who, const std::string& msg) const {
    throw graph_error(path_ + ":" + std::to_string(line) + ": " + who + ": " + msg);
  }

  std::string who(int i) const {
    auto& n = nodes_[i];
    return n.kind == "input" ? "input '" + n.name + "'" : "node '" + n.name + "' (" + n.kind + ")";
  }

  // " (attributes: out=768, bias=false)", or "" for a node without attributes: size errors then
  // show which written value made a tensor too large.
  std::string attrs_of(int i) const {
    std::string attrs;
    for (auto& [k, v] : nodes_[i].attrs.values()) attrs += (attrs.empty() ? "" : ", ") + k + "=" + v;
    return attrs.empty() ? "" : " (attributes: " + attrs + ")";
  }

  void index_names() {
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      auto [it, fresh] = index_.emplace(nodes_[i].name, i);
      if (!fresh)
        fail(nodes_[i].line, who(i), "duplicate name: '" + nodes_[i].name + "' is already defined at line " +
                                         std::to_string(nodes_[it->second].line));
    }
    for (auto& a : aliases_) {
      if (auto it = index_.find(a.name); it != index_.end())
        fail(a.line, "block '" + a.name + "'", "duplicate name: '" + a.name + "' is already defined at line " +
                                                   std::to_string(nodes_[it->second].line));
      index_[a.name] = index_.at(a.target);
    }
  }

  int resolve(const std::string& ref) const {
    auto it = index_.find(ref);
    return it == index_.end() ? -1 : it->second;
  }

  std::string suggest(const std::string& ref) const {
    std::vector<std::string> names;
    for (auto& [name, i] : index_) names.push_back(name);
    return did_you_mean(ref, names);
  }

  void make_ops() {
    impls_.resize(nodes_.size());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      auto& n = nodes_[i];
      if (n.kind == "input") continue;
      try {
        impls_[i] = ops_.make(n.kind, n.attrs);
      } catch (const std::exception& e) {
        fail(n.line, who(i), e.what() + attrs_of(static_cast<int>(i)));
      }
      if (!impls_[i]) fail(n.line, who(i), "the op factory returned nothing");
      int arity = impls_[i]->arity();
      int got = static_cast<int>(n.in.size());
      std::string list;
      for (auto& r : n.in) list += (list.empty() ? "'" : ", '") + r + "'";
      if (arity >= 0 && got != arity)
        fail(n.line, who(i), "wrong arity: takes " + std::to_string(arity) + " input" + (arity == 1 ? "" : "s") +
                                 ", got " + std::to_string(got) + (list.empty() ? "" : " (" + list + ")"));
      if (arity < 0 && got == 0) fail(n.line, who(i), "wrong arity: takes at least 1 input, got none");
    }
  }

  // Each producer may feed a node once: add(x, x) would be the only legitimate use and is just
  // 2x, while a repeated name is far more often a typo; the runtime can then key messages by
  // (producer, consumer) pairs.
  void resolve_edges() {
    producers_.resize(nodes_.size());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      auto& n = nodes_[i];
      for (size_t k = 0; k < n.in.size(); ++k) {
        int p = resolve(n.in[k]);
        if (p < 0) fail(n.in_lines[k], who(i), "input '" + n.in[k] + "' names no node" + suggest(n.in[k]));
        if (std::find(producers_[i].begin(), producers_[i].end(), p) != producers_[i].end())
          fail(n.in_lines[k], who(i), "duplicate edge: input '" + n.in[k] +
                                          "' is listed twice (a node may read each producer once)");
        producers_[i].push_back(p);
      }
    }
  }

  // tokens, targets and logits are optional here (the feeds decide what a model needs); loss
  // is not.
  int resolve_declaration(const graph_declaration& d) const {
    if (d.value.empty() && d.field != "loss") return -1;
    if (d.value.empty())
      fail(1, "model", "missing declaration 'loss: \"<node>\"' (every model names its scalar loss node)");
    int i = resolve(d.value);
    if (i < 0) fail(d.line, d.field, "'" + d.value + "' names no node" + suggest(d.value));
    return i;
  }

  // Boost's topological sort is a DFS; visiting vertices in reverse file order makes the result
  // the file order whenever the file is already topologically sorted, so a model reads top-down.
  std::vector<int> topo_order() const {
    const size_t n = nodes_.size();
    auto vx = [n](size_t i) { return n - 1 - i; };
    bgraph g(n);
    for (size_t i = 0; i < n; ++i)
      for (int p : producers_[i]) boost::add_edge(vx(p), vx(i), g);
    std::vector<size_t> post;
    try {
      boost::topological_sort(g, std::back_inserter(post));
    } catch (const boost::not_a_dag&) {
      report_cycle(g);
    }
    std::vector<int> order;
    for (auto it = post.rbegin(); it != post.rend(); ++it) order.push_back(static_cast<int>(vx(*it)));
    return order;
  }

  [[noreturn]] void report_cycle(const bgraph& g) const {
    const size_t n = nodes_.size();
    std::vector<size_t> parent(n, n);
    std::pair<size_t, size_t> back{0, 0};
    bool found = false;
    cycle_finder vis;
    vis.parent = &parent;
    vis.back = &back;
    vis.found = &found;
    boost::depth_first_search(g, boost::visitor(vis));
    // back edge u -> v: v is a DFS ancestor of u, so v -> ... -> u -> v is a cycle.
    std::vector<size_t> path{back.first};
    for (size_t x = back.first; x != back.second && parent[x] != n;) path.push_back(x = parent[x]);
    std::reverse(path.begin(), path.end());
    // Start the cycle at the node that comes first in the file (the highest vertex number).
    std::rotate(path.begin(), std::max_element(path.begin(), path.end()), path.end());
    std::string text;
    for (size_t v : path) text += nodes_[n - 1 - v].name + " -> ";
    int first = static_cast<int>(n - 1 - path[0]);
    fail(nodes_[first].line, who(first), "cycle: " + text + nodes_[first].name);
  }

  void infer_shapes(const std::vector<int>& order) {
    shapes_.resize(nodes_.size());
    types_.resize(nodes_.size(), dtype::f32);
    for (int i : order) {
      auto& n = nodes_[i];
      if (n.kind == "input") {
        if (auto allowed = tensor_size_allowed(n.shape); !allowed)
          fail(n.line, who(i), "shape " + to_string(n.shape) + " " + allowed.error() + see_limits);
        shapes_[i] = n.shape;
        types_[i] = n.type;
        continue;
      }
      std::vector<shape_t> in;
      std::vector<dtype> types;
      std::string listing;
      for (int p : producers_[i]) {
        in.push_back(shapes_[p]);
        types.push_back(types_[p]);
        listing += (listing.empty() ? "'" : ", '") + nodes_[p].name + "' " + describe(shapes_[p], types_[p]);
      }
      try {
        shapes_[i] = impls_[i]->infer_shape(in, types);
      } catch (const std::exception& e) {
        fail(n.line, who(i), std::string("shape mismatch: ") + e.what() + " (inputs: " + listing + ")");
      }
      if (auto allowed = tensor_size_allowed(shapes_[i]); !allowed)
        fail(n.line, who(i),
             "output shape " + to_string(shapes_[i]) + " " + allowed.error() + attrs_of(i) + see_limits);
      check_params(i, in);
      // An op's output shares the floating type of its inputs (f64 only in precision tests).
      types_[i] = std::count(types.begin(), types.end(), dtype::f64) ? dtype::f64 : dtype::f32;
    }
  }

  // Every parameter within the per-tensor limit and the model's total within graph_max_params,
  // so that the runtime never allocates a wrapped-around size or runs out of memory on a typo
  // (vocab 10^12) far from the file line that caused it.
  void check_params(int i, const std::vector<shape_t>& in) {
    const auto& n = nodes_[i];
    std::vector<param_spec> specs;
    try {
      specs = impls_[i]->params(in);
    } catch (const std::exception& e) {
      fail(n.line, who(i), std::string("cannot size its parameters: ") + e.what() + attrs_of(i));
    }
    for (auto& p : specs) {
      if (auto allowed = tensor_size_allowed(p.shape); !allowed)
        fail(n.line, who(i),
             "parameter '" + p.name + "' " + to_string(p.shape) + " " + allowed.error() + attrs_of(i) + see_limits);
      // Each term is at most 2^32 and the sum stops at 2^36 + 2^32: no overflow.
      param_total_ += numel_of(p.shape);
      if (param_total_ > graph_max_params)
        fail(n.line, who(i), "the model's parameters reach " + std::to_string(param_total_) +
                                 " with this node, more than the limit of " + power_of_two_text(graph_max_params) +
                                 " per model" + attrs_of(i) + see_limits);
    }
  }

  // Every input gets exactly one feed, from its own `feed:` or from the model-level `tokens:` /
  // `targets:`; the feeds must form one data source's set, or the consumers of an input nobody
  // fills would wait for data forever.
  void assign_feeds() {
    feed_.assign(nodes_.size(), "");
    for (size_t i = 0; i < nodes_.size(); ++i) feed_[i] = nodes_[i].feed;
    for (int k : {0, 1}) {
      const int i = declared_[k];
      if (i < 0) continue;
      const auto& d = decls_[k];
      if (nodes_[i].kind != "input") fail(d.line, d.field, "'" + d.value + "' must name an input, not a " + nodes_[i].kind + " node");
      if (!feed_[i].empty() && feed_[i] != d.field)
        fail(d.line, d.field, "input '" + d.value + "' already has feed: \"" + feed_[i] + "\"");
      feed_[i] = d.field;
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const auto& n = nodes_[i];
      if (n.kind != "input") continue;
      if (feed_[i].empty())
        fail(n.line, "node '" + n.name + "'",
             "input '" + n.name + "' is not fed by anything: give it feed: \"tokens\", \"targets\", \"images\" or "
             "\"labels\" (or compute it from a fed input with an op)");
      auto [it, fresh] = fed_.emplace(feed_[i], static_cast<int>(i));
      if (!fresh)
        fail(n.line, "input '" + n.name + "'", "feed '" + feed_[i] + "' is already given to input '" +
                                                   nodes_[it->second].name + "' (line " +
                                                   std::to_string(nodes_[it->second].line) + ")");
    }
    const bool text = fed_.count("tokens") || fed_.count("targets");
    const bool image = fed_.count("images") || fed_.count("labels");
    if (text && image)
      fail(1, "model", "mixes text feeds (tokens, targets) with image feeds (images, labels); a model reads one "
                       "data source");
    if (!text && !image)
      fail(1, "model", "no input is fed: a text model needs inputs with feed: \"tokens\" and \"targets\" (or "
                       "tokens: and targets: naming them), an image model feed: \"images\" and \"labels\"");
    for (const char* f : text ? text_feeds : image_feeds)
      if (!fed_.count(f))
        fail(1, "model", std::string("no input is fed '") + f + "': a " + (text ? "text" : "image") +
                             " model needs inputs with feed: " +
                             (text ? "\"tokens\" and \"targets\"" : "\"images\" and \"labels\""));
  }

  int fed(const char* feed) const {
    auto it = fed_.find(feed);
    return it == fed_.end() ? -1 : it->second;
  }

  // Where a feed's requirement fails: the declaration's line when it came from one, else the
  // input's own line.
  std::pair<int, std::string> feed_site(const char* feed) const {
    const int i = fed(feed);
    for (int k : {0, 1})
      if (declared_[k] == i && decls_[k].field == feed) return {decls_[k].line, decls_[k].field};
    return {nodes_[i].line, "input '" + nodes_[i].name + "'"};
  }

  void check_declarations() const {
    const int logits = declared_[2], loss = declared_[3];
    if (fed("tokens") >= 0) {
      const int tokens = fed("tokens"), targets = fed("targets");
      for (const char* f : {"tokens", "targets"}) {
        const int i = fed(f);
        auto [line, who] = feed_site(f);
        if (types_[i] != dtype::i32) fail(line, who, "input '" + nodes_[i].name + "' must have dtype I32 (token ids)");
        if (shapes_[i].size() != 2 || shapes_[i][0] != batch_)
          fail(line, who, "input '" + nodes_[i].name + "' must have shape (B, T) = [" + std::to_string(batch_) +
                              ", T], got " + to_string(shapes_[i]));
      }
      if (shapes_[targets] != shapes_[tokens])
        fail(feed_site("targets").first, feed_site("targets").second,
             "shape " + to_string(shapes_[targets]) + " differs from tokens " + to_string(shapes_[tokens]));
      if (logits < 0)
        fail(1, "model", "missing declaration 'logits: \"<node>\"' (a text model names its (B, T, V) logits for "
                         "sampling)");
      const shape_t& l = shapes_[logits];
      if (l.size() != 3 || l[0] != shapes_[tokens][0] || l[1] != shapes_[tokens][1])
        fail(decls_[2].line, "logits", "node '" + nodes_[logits].name + "' has shape " + to_string(l) +
                                           ", expected (B, T, V) = [" + std::to_string(shapes_[tokens][0]) + ", " +
                                           std::to_string(shapes_[tokens][1]) + ", V]");
    } else {
      const int images = fed("images"), labels = fed("labels");
      auto [iline, iwho] = feed_site("images");
      if (types_[images] == dtype::i32 || shapes_[images].size() != 4 || shapes_[images][0] != batch_)
        fail(iline, iwho, "input '" + nodes_[images].name + "' must be F32 with shape (B, C, H, W) = [" +
                              std::to_string(batch_) + ", C, H, W], got " + to_string(shapes_[images]) + " " +
                              to_string(types_[images]));
      auto [lline, lwho] = feed_site("labels");
      if (types_[labels] != dtype::i32 || shapes_[labels] != shape_t{batch_})
        fail(lline, lwho, "input '" + nodes_[labels].name + "' must be I32 class ids with shape (B) = [" +
                              std::to_string(batch_) + "], got " + to_string(shapes_[labels]) + " " +
                              to_string(types_[labels]));
      if (logits >= 0 && (shapes_[logits].size() != 2 || shapes_[logits][0] != batch_))
        fail(decls_[2].line, "logits", "node '" + nodes_[logits].name + "' has shape " + to_string(shapes_[logits]) +
                                           ", expected (B, classes) = [" + std::to_string(batch_) + ", classes]");
    }
    if (numel_of(shapes_[loss]) != 1 || nodes_[loss].kind == "input")
      fail(decls_[3].line, "loss", "node '" + nodes_[loss].name + "' must be a scalar op output, got shape " +
                                       to_string(shapes_[loss]));
  }

  // A dead end would never receive a gradient, and its producers would wait for it forever.
  void check_dead_ends() const {
    std::vector<int> consumed(nodes_.size(), 0);
    for (auto& ps : producers_)
      for (int p : ps) consumed[p] = 1;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (!consumed[i] && static_cast<int>(i) != declared_[2] && static_cast<int>(i) != declared_[3])
        fail(nodes_[i].line, who(static_cast<int>(i)),
             "unused: its output feeds no node and it is neither the loss nor the logits");
  }

  graph assemble(const std::vector<int>& order, const std::string& model_name) {
    graph g;
    g.name = model_name;
    g.file = path_;
    g.batch = batch_;
    std::vector<int> id(nodes_.size());
    for (size_t k = 0; k < order.size(); ++k) id[order[k]] = static_cast<int>(k);
    g.nodes.resize(nodes_.size());
    for (size_t k = 0; k < order.size(); ++k) {
      int i = order[k];
      graph_node& out = g.nodes[k];
      out.id = static_cast<int>(k);
      out.name = nodes_[i].name;
      out.kind = nodes_[i].kind;
      out.attrs = nodes_[i].attrs;
      out.shape = shapes_[i];
      out.type = types_[i];
      out.impl = std::move(impls_[i]);
      out.line = nodes_[i].line;
      for (size_t slot = 0; slot < producers_[i].size(); ++slot) {
        int p = id[producers_[i][slot]];
        out.inputs.push_back(p);
        g.nodes[p].consumers.push_back({static_cast<int>(k), static_cast<int>(slot)});
      }
    }
    auto node_id = [&](int i) { return i < 0 ? -1 : id[i]; };
    g.tokens_node = node_id(fed("tokens"));
    g.targets_node = node_id(fed("targets"));
    g.logits_node = node_id(declared_[2]);
    g.loss_node = id[declared_[3]];
    for (const char* f : g.tokens_node >= 0 ? text_feeds : image_feeds)
      g.feeds.push_back({f, id[fed(f)]});
    if (g.is_text()) {
      g.context = g.nodes[g.tokens_node].shape[1];
      g.vocab = g.nodes[g.logits_node].shape[2];
      g.row_items = g.context;
    }
    return g;
  }

  // Every op whose output several nodes read gets an identity node between it and them, named
  // "<op>.fan", right after it in graph order. A tensor then crosses a cut once (the fan-out node
  // sits with the readers, scheduler/plan.cpp) instead of once per reader, and its gradients come
  // back summed. The consumers keep their order, so the gradient sum is the same, bit for bit.
  // Skipped for an op table without "identity" (tests' fake tables).
  graph insert_fanouts(graph g) const {
    if (std::find(ops_.kinds.begin(), ops_.kinds.end(), "identity") == ops_.kinds.end()) return g;
    const size_t n = g.nodes.size();
    std::vector<int> id(n), fan(n, -1);
    int next = 0;
    for (size_t i = 0; i < n; ++i) {
      const graph_node& node = g.nodes[i];
      id[i] = next++;
      if (!node.is_input() && node.consumers.size() >= 2 && node.type == dtype::f32) fan[i] = next++;
    }
    if (next == static_cast<int>(n)) return g;
    std::set<std::string> names;
    for (auto& node : g.nodes) names.insert(node.name);
    std::vector<graph_node> old = std::move(g.nodes);
    g.nodes = std::vector<graph_node>(next);
    for (size_t i = 0; i < n; ++i) {
      graph_node& node = g.nodes[id[i]];
      node = std::move(old[i]);
      node.id = id[i];
      node.consumers.clear();
      for (int& p : node.inputs) p = fan[p] >= 0 ? fan[p] : id[p];
      if (fan[i] < 0) continue;
      graph_node& f = g.nodes[fan[i]];
      f.id = fan[i];
      f.name = node.name + ".fan";
      for (int k = 2; names.count(f.name); ++k) f.name = node.name + ".fan" + std::to_string(k);
      names.insert(f.name);
      f.kind = "identity";
      f.inputs = {id[i]};
      f.shape = node.shape;
      f.type = node.type;
      f.impl = ops_.make("identity", attr_map{});
      f.line = node.line;
      f.fanout = true;
    }
    // Consumers in graph order, then slot: the order the graph had, which orders gradient sums.
    for (auto& node : g.nodes)
      for (size_t slot = 0; slot < node.inputs.size(); ++slot)
        g.nodes[node.inputs[slot]].consumers.push_back({node.id, static_cast<int>(slot)});
    auto remap = [&](int& i) { i = i < 0 ? -1 : id[i]; };
    remap(g.tokens_node);
    remap(g.targets_node);
    remap(g.logits_node);
    remap(g.loss_node);
    for (auto& f : g.feeds) remap(f.node);
    return g;
  }

  std::vector<pending_node> nodes_;
  const std::vector<graph_alias>& aliases_;
  const std::vector<graph_declaration>& decls_;
  const graph_op_table& ops_;
  const std::string& path_;
  int64_t batch_;
  std::map<std::string, int> index_;
  std::vector<std::unique_ptr<op>> impls_;
  std::vector<std::vector<int>> producers_;
  std::vector<int> declared_;        // tokens, targets, logits, loss (-1: not declared)
  std::vector<std::string> feed_;    // per node: its feed (inputs only)
  std::map<std::string, int> fed_;   // feed -> input node
  std::vector<shape_t> shapes_;
  std::vector<dtype> types_;
  int64_t param_total_ = 0;
};

}  // namespace

graph build_graph(std::vector<pending_node> nodes, const std::vector<graph_alias>& aliases,
                  const std::vector<graph_declaration>& declarations, const graph_op_table& ops,
                  const std::string& path, int64_t batch, const std::string& model_name) {
  return builder(std::move(nodes), aliases, declarations, ops, path, batch).run(model_name);
}

}  // namespace fusion
