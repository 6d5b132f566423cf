// Lower-level entry point of the model loader: load_graph/parse_graph (core/graph.hpp) with the
// op factory made explicit, so tests can check graph validation with stand-in ops and tools can
// load a graph against another op table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/graph.hpp"

namespace fusion {

/// Creates the op of one node; throws op_error for bad attributes (like fusion::make_op).
using graph_op_factory = std::function<std::unique_ptr<op>(const std::string& kind, const attr_map& attrs)>;

/// What parse_graph_with builds nodes from.
struct graph_op_table {
  graph_op_factory make;            ///< node factory
  std::vector<std::string> kinds;   ///< every kind `make` knows (checked before calling it)
};

/// The real ops: fusion::make_op and fusion::op_kinds().
graph_op_table default_op_table();

/// parse_graph with an explicit op table.
graph parse_graph_with(const std::string& text, const std::string& path, int64_t batch,
                       const graph_op_table& ops);

}  // namespace fusion
