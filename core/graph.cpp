#include "core/graph.hpp"

namespace fusion {

bool graph_feed_known(const std::string& feed) {
  return feed == "tokens" || feed == "targets" || feed == "images" || feed == "labels";
}

int graph::find(const std::string& n) const {
  for (auto& node : nodes)
    if (node.name == n) return node.id;
  return -1;
}

int64_t graph::param_count() const {
  int64_t total = 0;
  for (auto& node : nodes) {
    if (!node.impl) continue;
    std::vector<shape_t> in;
    for (int p : node.inputs) in.push_back(nodes[p].shape);
    for (auto& spec : node.impl->params(in)) total += numel_of(spec.shape);
  }
  return total;
}

}  // namespace fusion
