// Model file loader: text format -> expanded node list -> validated, shape-inferred OP-DAG.
//
// Stages, each throwing graph_error "FILE:LINE: <what>: <message>" on the first problem:
//   1. parse (protobuf text format, line:column from the ErrorCollector)
//   2. constants, in file order, and templates (checked once, expanded by the blocks that use them)
//   3. expand inputs, nodes and blocks in file order (block instances named "h0.ln1", ...)
//   4. resolve names to producers, make ops, check arity, edges, cycles (Boost.Graph)
//   5. infer shapes in topological order, check the feeds (tokens and targets, or images and
//      labels) and the logits/loss declarations, that every input is fed and that no node is a
//      dead end.
// Format reference: docs/model-format.md.
#include "core/graph_loader.hpp"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "base/file_text.hpp"
#include "core/graph_build.hpp"
#include "core/graph_expr.hpp"
#include "core/graph_names.hpp"
#include "core/text_format.hpp"
#include "graph.pb.h"

namespace fusion {

namespace {

namespace gp = google::protobuf;
using info_tree = text_format::info_tree;
using text_format::line_of;
using text_format::nested;

constexpr int64_t max_repeat = 10000;
// Every node becomes an actor; a model this large is a typo (many large repeats), not a design,
// and would exhaust memory while expanding instead of failing with a line number. 2^20 let a
// 5 KB file (a block of 100 nodes repeated 10000 times) hold 1.2 GB and minutes of loading
// under ASan before any error (found by tests/fuzz/fuzz_model.cpp); the largest real models
// (configs/models) have about 600 nodes.
constexpr size_t max_nodes = size_t{1} << 16;
// Longest node name after block expansion: its parameters are saved as "NAME/param.m" and so on,
// and a checkpoint's tensor names hold at most 4096 bytes (core/checkpoint.hpp). Refused here,
// at load, rather than after training when the checkpoint would fail.
constexpr size_t max_node_name_bytes = 1024;

// "the name of N bytes is longer than ...": the reason, with the name cut for the message.
std::string long_name_problem(const std::string& name) {
  return "its name has " + std::to_string(name.size()) + " bytes, more than " + std::to_string(max_node_name_bytes) +
         " (a checkpoint could not hold its parameters, saved as NAME/param): shorten it";
}
std::string short_name(const std::string& name) { return name.size() > 64 ? name.substr(0, 64) + "..." : name; }

// A user-chosen node, input or block name: letters, digits, '_' and '-', not starting with a
// digit or '-'. '.' is reserved for block instances and '$' for "$in".
bool is_node_name(const std::string& n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

class loader {
 public:
  loader(const std::string& path, int64_t batch, const graph_op_table& ops)
      : path_(path), batch_(batch), ops_(ops) {}

  graph run(const std::string& text) {
    if (batch_ < 1) throw graph_error(path_ + ": batch size must be >= 1, got " + std::to_string(batch_));
    parse(text);
    constants();
    templates();
    expand();
    resolve_empty_blocks();
    return build_graph(std::move(nodes_), aliases_, declarations(), ops_, path_, batch_, model_.name());
  }

 private:
  [[noreturn]] void fail(int line, const std::string& who, const std::string& msg) const {
    throw graph_error(path_ + ":" + std::to_string(line) + ": " + who + ": " + msg);
  }

  void parse(const std::string& text) {
    if (auto parsed = text_format::parse(text, model_, tree_, "model file"); !parsed)
      throw graph_error(path_ + ":" + parsed.error());
  }

  void constants() {
    consts_["B"] = graph_value::of_int(batch_);
    auto* d = pb::model::descriptor();
    for (int i = 0; i < model_.const__size(); ++i) {
      const auto& c = model_.const_(i);
      int line = line_of(&tree_, d, "const", i);
      std::string who = "const '" + c.name() + "'";
      if (c.name() == "B") fail(line, who, "B is reserved: it is the batch size given at load time");
      if (!is_constant_name(c.name()))
        fail(line, who, "bad constant name (use letters, digits and '_', not starting with a digit)");
      if (consts_.count(c.name())) fail(line, who, "defined twice");
      if (c.v_case() == pb::model_const::kValue) {
        consts_[c.name()] = graph_value::of_int(c.value());
      } else if (c.v_case() == pb::model_const::kExpr) {
        consts_[c.name()] = eval(c.expr(), line, who, "expr");
      } else {
        fail(line, who, "needs 'value: <integer>' or 'expr: \"<expression>\"'");
      }
    }
  }

  // `scope` is the file's constants, or inside a template instance those plus the bound params.
  graph_value eval(const std::string& text, int line, const std::string& who, const std::string& what,
                   const graph_constants* scope = nullptr) const {
    try {
      return eval_graph_expr(text, scope ? *scope : consts_);
    } catch (const graph_expr_error& e) {
      // Quote a long expression (10,000 parentheses) by its start: the message stays one line.
      const std::string shown = text.size() > 60 ? text.substr(0, 60) + "..." : text;
      fail(line, who, what + " \"" + shown + "\": " + e.what());
    }
  }

  // Inputs, nodes and blocks in the order they appear in the file (protobuf keeps each
  // repeated field's order, the parse tree tells how the three interleave).
  void expand() {
    auto* d = pb::model::descriptor();
    std::vector<std::tuple<int, int, int, int>> items;  // line, column, field (0 input, 1 node, 2 block), index
    const char* fields[] = {"input", "node", "block"};
    int sizes[] = {model_.input_size(), model_.node_size(), model_.block_size()};
    for (int f = 0; f < 3; ++f)
      for (int i = 0; i < sizes[f]; ++i) {
        auto loc = tree_.GetLocation(d->FindFieldByName(fields[f]), i);
        items.emplace_back(loc.line, loc.column, f, i);
      }
    std::sort(items.begin(), items.end());
    for (auto& [line, column, f, i] : items) {
      (void)column;
      if (f == 0) add_input(model_.input(i), line + 1);
      else if (f == 1) add_node(model_.node(i), nested(&tree_, d, "node", i), line + 1, "", {}, "");
      else add_block(model_.block(i), nested(&tree_, d, "block", i), line + 1);
    }
  }

  void add_input(const pb::model_input& in, int line) {
    std::string who = "input '" + short_name(in.name()) + "'";
    if (!is_node_name(in.name()))
      fail(line, who, "bad name (use letters, digits, '_' and '-', starting with a letter or '_')");
    if (in.name().size() > max_node_name_bytes) fail(line, who, long_name_problem(in.name()));
    pending_node n;
    n.name = in.name();
    n.kind = "input";
    n.line = line;
    n.type = in.dtype() == pb::model_input::I32 ? dtype::i32
             : in.dtype() == pb::model_input::F64 ? dtype::f64 : dtype::f32;
    n.feed = in.feed();
    if (!n.feed.empty() && !graph_feed_known(n.feed))
      fail(line, who, "unknown feed '" + n.feed + "' (known: tokens, targets, images, labels)");
    if (in.shape().empty()) fail(line, who, "missing 'shape', e.g. shape: \"B,T\"");
    std::stringstream dims(in.shape());
    for (std::string dim; std::getline(dims, dim, ',');) {
      graph_value v = eval(dim, line, who, "shape dimension");
      if (v.type != graph_value::kind::integer || v.i < 1)
        fail(line, who, "shape \"" + in.shape() + "\": dimension \"" + dim + "\" must be an integer >= 1, got " +
                            v.to_string());
      n.shape.push_back(v.i);
    }
    nodes_.push_back(std::move(n));
  }

  // One node; inside instance `prefix` ("h3.") of a block whose nodes are `local` and whose
  // "$in" is `block_in`. Outside blocks prefix is "" and "$in" is an error. Attributes are
  // evaluated in `scope` (null: the file's constants).
  void add_node(const pb::model_node& src, const info_tree* tree, int line, const std::string& prefix,
                const std::vector<std::string>& local, const std::string& block_in,
                const graph_constants* scope = nullptr) {
    auto* d = pb::model_node::descriptor();
    pending_node n;
    n.name = prefix + src.name();
    n.kind = src.op();
    n.line = line;
    std::string who = "node '" + short_name(n.name) + "'";
    if (n.name.size() > max_node_name_bytes) fail(line, who, long_name_problem(n.name));
    if (nodes_.size() >= max_nodes)
      fail(line, who, "the model has more than " + std::to_string(max_nodes) +
                          " nodes after expanding blocks; see \"Limits\" in docs/model-format.md");
    if (!is_node_name(src.name()))
      fail(line, who, "bad node name (use letters, digits, '_' and '-', starting with a letter or '_'; "
                      "'.' is reserved for block instances)");
    if (src.op().empty()) fail(line, who, "missing 'op' (known ops: " + known_ops() + ")");
    if (std::find(ops_.kinds.begin(), ops_.kinds.end(), src.op()) == ops_.kinds.end())
      fail(line, who, "unknown op '" + src.op() + "'" + did_you_mean(src.op(), ops_.kinds) + "; known ops: " +
                          known_ops());
    who += " (" + src.op() + ")";
    const auto* known = op_attributes(src.op());  // null for kinds outside the registry
    for (int a = 0; a < src.attr_size(); ++a) {
      const auto& at = src.attr(a);
      int aline = line_of(tree, d, "attr", a);
      if (known && std::find(known->begin(), known->end(), at.key()) == known->end()) {
        std::string list;
        for (auto& k : *known) list += (list.empty() ? "" : ", ") + k;
        fail(aline, who, "unknown attribute '" + at.key() + "'" + did_you_mean(at.key(), *known) +
                             "; known attributes of " + src.op() + ": " + (list.empty() ? "none" : list));
      }
      if (n.attrs.has(at.key())) fail(aline, who, "attribute '" + at.key() + "' given twice");
      n.attrs.set(at.key(), eval(at.value(), aline, who, "attribute '" + at.key() + "'", scope).to_string());
    }
    for (int k = 0; k < src.in_size(); ++k) {
      const std::string& ref = src.in(k);
      int iline = line_of(tree, d, "in", k);
      std::string target = ref;
      if (ref == "$in") {
        if (prefix.empty()) fail(iline, who, "'$in' is only valid inside a block");
        target = block_in;
      } else if (std::find(local.begin(), local.end(), ref) != local.end()) {
        target = prefix + ref;
      }
      n.in.push_back(target);
      n.in_lines.push_back(iline);
    }
    nodes_.push_back(std::move(n));
  }

  // Templates may be defined anywhere in the file (they are not graph items); each is checked
  // here once, its nodes' ops and attributes at every use.
  void templates() {
    auto* d = pb::model::descriptor();
    auto* td = pb::model_template::descriptor();
    for (int i = 0; i < model_.template__size(); ++i) {
      const auto& t = model_.template_(i);
      const info_tree* tree = nested(&tree_, d, "template", i);
      const int line = line_of(&tree_, d, "template", i);
      const std::string who = "template '" + t.name() + "'";
      if (!is_node_name(t.name()))
        fail(line, who, "bad template name (use letters, digits, '_' and '-', starting with a letter or '_')");
      if (auto it = templates_.find(t.name()); it != templates_.end())
        fail(line, who, "defined twice (first at line " + std::to_string(it->second.line) + ")");
      for (int k = 0; k < t.param_size(); ++k) {
        const std::string& p = t.param(k);
        const int pline = line_of(tree, td, "param", k, line);
        if (p == "B") fail(pline, who, "param 'B': B is reserved: it is the batch size given at load time");
        if (!is_constant_name(p))
          fail(pline, who, "param '" + p + "': bad constant name (use letters, digits and '_', not starting "
                           "with a digit)");
        for (int j = 0; j < k; ++j)
          if (t.param(j) == p) fail(pline, who, "param '" + p + "' listed twice");
      }
      if (t.node_size() == 0) fail(line, who, "has no nodes");
      check_output(t.output(), t.node(), line_of(tree, td, "output", -1, line), who, "template");
      templates_[t.name()] = {&t, tree, line};
    }
  }

  // `what` is "block" or "template".
  void check_output(const std::string& output, const gp::RepeatedPtrField<pb::model_node>& nodes, int line,
                    const std::string& who, const std::string& what) const {
    std::vector<std::string> local;
    for (auto& n : nodes) local.push_back(n.name());
    if (std::find(local.begin(), local.end(), output) == local.end())
      fail(line, who, output.empty() ? "missing 'output' (the " + what + " node that feeds the next repetition)"
                                     : "output '" + output + "' is not a node of the " + what +
                                           did_you_mean(output, local));
  }

  // The nodes a block expands: its own, or its template's with the params bound by its args.
  struct block_body {
    const gp::RepeatedPtrField<pb::model_node>* nodes;
    const info_tree* tree;      // locations of the nodes (in the block or in the template)
    const gp::Descriptor* d;    // model_block or model_template
    std::string output;
    std::optional<graph_constants> scope;  // the file's constants plus the params (templates only)
  };

  block_body body_of(const pb::model_block& b, const info_tree* tree, int line, const std::string& who) const {
    auto* d = pb::model_block::descriptor();
    if (b.use().empty()) {
      if (b.arg_size() > 0)
        fail(line_of(tree, d, "arg", 0, line), who,
             "arg '" + b.arg(0).key() + "' without 'use' (args bind the params of a template)");
      if (b.node_size() == 0) fail(line, who, "has no nodes (list them, or take a template's with use: \"<name>\")");
      check_output(b.output(), b.node(), line_of(tree, d, "output", -1, line), who, "block");
      return {&b.node(), tree, d, b.output(), std::nullopt};
    }
    const int uline = line_of(tree, d, "use", -1, line);
    auto it = templates_.find(b.use());
    if (it == templates_.end()) {
      std::vector<std::string> names;
      for (auto& [name, t] : templates_) names.push_back(name);
      std::string known;
      for (auto& n : names) known += (known.empty() ? "" : ", ") + n;
      fail(uline, who, "unknown template '" + b.use() + "'" + did_you_mean(b.use(), names) +
                           (known.empty() ? "; the file defines no templates" : "; templates: " + known));
    }
    const pb::model_template& t = *it->second.src;
    const std::string of = "template '" + t.name() + "' (line " + std::to_string(it->second.line) + ")";
    if (b.node_size() > 0)
      fail(line_of(tree, d, "node", 0, line), who,
           "lists nodes and uses " + of + ": a block takes its nodes from one or the other");
    if (!b.output().empty())
      fail(line_of(tree, d, "output", -1, line), who, "'output' comes from " + of + "; remove it here");
    const std::vector<std::string> names(t.param().begin(), t.param().end());
    std::string params;
    for (auto& p : names) params += (params.empty() ? "" : ", ") + p;
    params = params.empty() ? "it has none" : "its params: " + params;
    graph_constants scope = consts_;
    std::set<std::string> bound;
    for (int k = 0; k < b.arg_size(); ++k) {
      const auto& a = b.arg(k);
      const int aline = line_of(tree, d, "arg", k, line);
      if (std::find(names.begin(), names.end(), a.key()) == names.end())
        fail(aline, who, "unknown arg '" + a.key() + "'" + did_you_mean(a.key(), names) + " for " + of + "; " + params);
      if (!bound.insert(a.key()).second) fail(aline, who, "arg '" + a.key() + "' given twice");
      // Evaluated with the file's constants only: an arg never sees another arg.
      scope[a.key()] = eval(a.value(), aline, who, "arg '" + a.key() + "'");
    }
    for (auto& p : names)
      if (!bound.count(p))
        fail(uline, who, "missing arg '" + p + "' for " + of + " (every param needs one arg { key value }); " +
                             params);
    return {&t.node(), it->second.tree, pb::model_template::descriptor(), t.output(), std::move(scope)};
  }

  void add_block(const pb::model_block& b, const info_tree* tree, int line) {
    auto* d = pb::model_block::descriptor();
    std::string who = "block '" + b.name() + "'";
    if (!is_node_name(b.name()))
      fail(line, who, "bad block name (use letters, digits, '_' and '-', starting with a letter or '_')");
    const block_body body = body_of(b, tree, line, who);
    int rline = line_of(tree, d, "repeat", -1, line);
    if (b.repeat().empty()) fail(line, who, "missing 'repeat', e.g. repeat: \"L\"");
    graph_value r = eval(b.repeat(), rline, who, "repeat");
    if (r.type != graph_value::kind::integer) fail(rline, who, "repeat must be an integer, got " + r.to_string());
    // A template block may be empty: a stage of N blocks is a down block plus N-1 plain ones,
    // for every N >= 1. A listed block with no instances would be dead text.
    const bool uses = !b.use().empty();
    if (r.i < (uses ? 0 : 1))
      fail(rline, who, "repeat must be >= " + std::string(uses ? "0" : "1") + ", got " + std::to_string(r.i) +
                           " (\"" + b.repeat() + "\")" + (uses ? "" : " (only a block with use: may repeat 0 times)"));
    // A typo like "L*L*L" must not try to build millions of nodes.
    if (r.i > max_repeat)
      fail(rline, who, "repeat " + std::to_string(r.i) + " is implausibly large (limit " + std::to_string(max_repeat) + ")");
    std::vector<std::string> local;
    for (auto& n : *body.nodes) local.push_back(n.name());
    bool uses_in = false;
    for (auto& n : *body.nodes)
      for (auto& ref : n.in()) uses_in |= ref == "$in";
    if (uses_in && b.input().empty()) fail(line, who, "uses '$in' but has no 'input' (the node feeding repetition 0)");
    if (r.i == 0) {
      if (b.input().empty())
        fail(line, who, "repeats 0 times but has no 'input' (an empty block stands for its input)");
      empty_blocks_.push_back(aliases_.size());
    }
    // Refused before expanding, instead of after building up to max_nodes nodes.
    const auto per_instance = static_cast<size_t>(body.nodes->size());
    const size_t room = nodes_.size() < max_nodes ? max_nodes - nodes_.size() : 0;
    if (per_instance > 0 && static_cast<size_t>(r.i) > room / per_instance)
      fail(rline, who, "repeat " + std::to_string(r.i) + " of " + std::to_string(per_instance) +
                           " nodes makes the model more than " + std::to_string(max_nodes) +
                           " nodes; see \"Limits\" in docs/model-format.md");
    const graph_constants* scope = body.scope ? &*body.scope : nullptr;
    std::string prev = b.input();
    for (int64_t i = 0; i < r.i; ++i) {
      std::string prefix = b.name() + std::to_string(i) + ".";
      for (int k = 0; k < body.nodes->size(); ++k)
        add_node(body.nodes->Get(k), nested(body.tree, body.d, "node", k), line_of(body.tree, body.d, "node", k),
                 prefix, local, prev, scope);
      prev = prefix + body.output;
    }
    aliases_.push_back({b.name(), prev, line});
  }

  // An empty block's name stands for its input: a node (anywhere in the file) or another block.
  // build_graph expects every alias to name a node, so chains of blocks are followed here.
  void resolve_empty_blocks() {
    if (empty_blocks_.empty()) return;
    std::set<std::string> names;
    for (auto& n : nodes_) names.insert(n.name);
    auto alias_of = [&](const std::string& name) {
      return std::find_if(aliases_.begin(), aliases_.end(), [&](const graph_alias& o) { return o.name == name; });
    };
    for (size_t e : empty_blocks_) {
      const graph_alias& a = aliases_[e];
      if (names.count(a.target) || alias_of(a.target) != aliases_.end()) continue;
      std::vector<std::string> known(names.begin(), names.end());
      for (auto& o : aliases_) known.push_back(o.name);
      fail(a.line, "block '" + a.name + "'",
           "input '" + a.target + "' names no node" + did_you_mean(a.target, known));
    }
    for (size_t e : empty_blocks_) {
      graph_alias& a = aliases_[e];
      for (size_t hops = 0; !names.count(a.target); ++hops) {
        if (hops > aliases_.size())
          fail(a.line, "block '" + a.name + "'", "empty blocks stand for each other in a cycle (through '" +
                                                     a.target + "')");
        a.target = alias_of(a.target)->target;
      }
    }
  }

  std::vector<graph_declaration> declarations() const {
    auto* d = pb::model::descriptor();
    return {{"tokens", model_.tokens(), line_of(&tree_, d, "tokens")},
            {"targets", model_.targets(), line_of(&tree_, d, "targets")},
            {"logits", model_.logits(), line_of(&tree_, d, "logits")},
            {"loss", model_.loss(), line_of(&tree_, d, "loss")}};
  }

  std::string known_ops() const {
    std::string out;
    for (auto& k : ops_.kinds) out += (out.empty() ? "" : ", ") + k;
    return out;
  }

  std::string path_;
  int64_t batch_;
  const graph_op_table& ops_;
  pb::model model_;
  info_tree tree_;
  graph_constants consts_;
  struct template_def {
    const pb::model_template* src;
    const info_tree* tree;
    int line;
  };
  std::map<std::string, template_def, std::less<>> templates_;
  std::vector<pending_node> nodes_;
  std::vector<graph_alias> aliases_;
  std::vector<size_t> empty_blocks_;  // indices into aliases_ of blocks repeated 0 times
};

}  // namespace

graph_op_table default_op_table() { return {make_op, op_kinds()}; }

graph parse_graph_with(const std::string& text, const std::string& path, int64_t batch, const graph_op_table& ops) {
  try {
    return loader(path, batch, ops).run(text);
  } catch (const std::bad_alloc&) {
    // The size limits make this unlikely; still name the file rather than print "std::bad_alloc".
    throw graph_error(path + ": not enough memory to load the model; see \"Limits\" in docs/model-format.md");
  }
}

graph parse_graph(const std::string& text, const std::string& path, int64_t batch) {
  return parse_graph_with(text, path, batch, default_op_table());
}

graph load_graph(const std::string& path, int64_t batch) {
  auto text = read_file_text(path, "model file");
  if (!text) throw graph_error(text.error());
  return parse_graph(*text, path, batch);
}

}  // namespace fusion
