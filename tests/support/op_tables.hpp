// The real op table without "identity": a model loads without the loader's fan-out nodes, for
// tests that check a model file's own nodes or price edges the loader would otherwise merge.
#pragma once

#include <vector>

#include "core/graph_loader.hpp"

namespace fusion::test {

inline graph_op_table op_table_without_fanouts() {
  graph_op_table t = default_op_table();
  std::erase(t.kinds, "identity");
  return t;
}

}  // namespace fusion::test
