// Second half of the model loader (internal to core/): from the expanded node list to a validated,
// topologically ordered, shape-inferred graph. The first half (core/graph_loader.cpp) parses
// the file, evaluates expressions and expands blocks.
#pragma once

#include <string>
#include <vector>

#include "core/graph.hpp"
#include "core/graph_loader.hpp"

namespace fusion {

/// A node after block expansion: names not yet resolved, op not yet made.
struct pending_node {
  std::string name;               ///< full name ("h3.fc" for block instances)
  std::string kind;               ///< op kind, or "input"
  std::vector<std::string> in;    ///< producer names or block aliases, one per input slot
  std::vector<int> in_lines;      ///< line of each `in:` entry
  attr_map attrs;                 ///< evaluated attributes
  shape_t shape;                  ///< inputs only: declared shape
  dtype type = dtype::f32;        ///< inputs only: declared dtype
  std::string feed;               ///< inputs only: declared feed ("tokens", "images", ...), may be empty
  int line = 0;
};

/// A block name standing for its last instance's output node.
struct graph_alias {
  std::string name;
  std::string target;
  int line = 0;
};

/// One of the model's tokens/targets/logits/loss fields.
struct graph_declaration {
  std::string field;   ///< "tokens", "targets", "logits", "loss"
  std::string value;   ///< node (or block) name, "" when missing
  int line = 0;        ///< 0 when missing
};

/// Resolves edges, makes ops, checks arity, duplicate names and edges, cycles, shapes,
/// declarations and dead ends; throws graph_error "PATH:LINE: ..." on the first problem.
/// `declarations` must hold tokens, targets, logits and loss in this order.
graph build_graph(std::vector<pending_node> nodes, const std::vector<graph_alias>& aliases,
                  const std::vector<graph_declaration>& declarations, const graph_op_table& ops,
                  const std::string& path, int64_t batch, const std::string& model_name);

}  // namespace fusion
