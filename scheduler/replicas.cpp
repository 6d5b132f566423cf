// Stage replicas: the accessors of a replicated placement, dealing micro-batches to replicas
// (routes) and turning a pipeline placement into a replicated one (docs/scheduler.md, "Stage
// replicas").
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "scheduler/placement.hpp"

namespace fusion {

bool placement::replicated() const {
  for (auto& s : stages)
    if (s.nodes.size() > 1) return true;
  return false;
}

int placement::replicas(int op) const {
  if (stages.empty()) return 1;
  return static_cast<int>(stages.at(stage_of_op.at(op)).nodes.size());
}

int placement::node_of(int op, int replica) const {
  if (replica == 0 || stages.empty()) {
    if (replica != 0) throw std::out_of_range("replica " + std::to_string(replica) + " of a placement without replicas");
    return node_of_op.at(op);
  }
  return stages.at(stage_of_op.at(op)).nodes.at(replica);
}

int placement::replica_of(int op, int m) const {
  if (stages.empty() || routes.empty()) return 0;
  return routes[static_cast<size_t>(m) % routes.size()].at(stage_of_op.at(op));
}

std::vector<std::vector<int>> deal_routes(const std::vector<stage_replicas>& stages, int micro_batches) {
  if (micro_batches < 1) throw std::invalid_argument("deal_routes: micro_batches must be at least 1");
  std::vector<std::vector<int>> routes(micro_batches, std::vector<int>(stages.size(), 0));
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& st = stages[s];
    const size_t r_count = st.nodes.size();
    if (r_count == 0) throw std::invalid_argument("deal_routes: stage " + std::to_string(s) + " has no nodes");
    if (st.weights.size() != r_count)
      throw std::invalid_argument("deal_routes: stage " + std::to_string(s) + " has " + std::to_string(r_count) +
                                  " nodes but " + std::to_string(st.weights.size()) + " weights");
    double total = 0;
    for (double w : st.weights) {
      if (!(w > 0) || !std::isfinite(w))
        throw std::invalid_argument("deal_routes: stage " + std::to_string(s) + " has a weight that is not positive");
      total += w;
    }
    // Counts by largest remainder: exactly proportional up to rounding, summing to M.
    std::vector<int> count(r_count, 0);
    std::vector<double> rest(r_count, 0.0);
    int dealt = 0;
    for (size_t r = 0; r < r_count; ++r) {
      const double share = micro_batches * st.weights[r] / total;
      count[r] = static_cast<int>(std::floor(share));
      rest[r] = share - count[r];
      dealt += count[r];
    }
    while (dealt < micro_batches) {
      size_t best = 0;
      for (size_t r = 1; r < r_count; ++r)
        if (rest[r] > rest[best] + 1e-12) best = r;
      ++count[best];
      rest[best] = -1;
      ++dealt;
    }
    // Smooth weighted round robin over the counts: replica r gets count[r] micro-batches, spread
    // over the step rather than in one run, so every replica starts early and the stage after it
    // is fed evenly.
    std::vector<long> current(r_count, 0);
    for (int m = 0; m < micro_batches; ++m) {
      size_t pick = 0;
      for (size_t r = 0; r < r_count; ++r) {
        current[r] += count[r];
        if (current[r] > current[pick]) pick = r;
      }
      current[pick] -= micro_batches;
      routes[m][s] = static_cast<int>(pick);
    }
  }
  return routes;
}

std::vector<int> routed_micro_batches(const placement& p, int stage) {
  if (p.stages.empty()) return {static_cast<int>(p.routes.size())};
  std::vector<int> out(p.stages.at(stage).nodes.size(), 0);
  for (auto& row : p.routes) ++out.at(row.at(stage));
  return out;
}

placement replicate(placement pipeline, std::vector<stage_replicas> stages, int micro_batches) {
  placement& p = pipeline;
  const int ops = static_cast<int>(p.node_of_op.size());
  int nodes = 0;
  for (int k : p.node_of_op) nodes = std::max(nodes, k + 1);
  for (auto& st : stages)
    for (int k : st.nodes) nodes = std::max(nodes, k + 1);
  std::vector<int> stage_of_node(nodes, -1);
  for (size_t s = 0; s < stages.size(); ++s) {
    auto& st = stages[s];
    if (st.nodes.empty()) throw std::invalid_argument("replicate: stage " + std::to_string(s) + " has no nodes");
    if (st.weights.empty()) st.weights.assign(st.nodes.size(), 1.0);
    for (int k : st.nodes) {
      if (k < 0) throw std::invalid_argument("replicate: stage " + std::to_string(s) + " names node index " + std::to_string(k));
      if (stage_of_node[k] == static_cast<int>(s))
        throw std::invalid_argument("replicate: node " + std::to_string(k) + " appears twice in stage " + std::to_string(s));
      if (stage_of_node[k] >= 0)
        throw std::invalid_argument("replicate: node " + std::to_string(k) + " is in stages " +
                                    std::to_string(stage_of_node[k]) + " and " + std::to_string(s));
      stage_of_node[k] = static_cast<int>(s);
    }
  }
  // Ops on a replica node other than the first belong to another stage: not allowed.
  std::vector<char> first_used(stages.size(), 0);
  for (int op = 0; op < ops; ++op) {
    const int k = p.node_of_op[op];
    if (k < 0) throw std::invalid_argument("replicate: graph node " + std::to_string(op) + " is on no node");
    const int s = stage_of_node[k];
    if (s < 0) {
      // A node of the pipeline without replicas: a stage of one.
      stage_of_node[k] = static_cast<int>(stages.size());
      stages.push_back({{k}, {1.0}});
      first_used.push_back(1);
      continue;
    }
    if (stages[s].nodes[0] != k)
      throw std::invalid_argument("replicate: node " + std::to_string(k) + " is replica of stage " + std::to_string(s) +
                                  " but also holds graph node " + std::to_string(op) + " as its first replica");
    first_used[s] = 1;
  }
  for (size_t s = 0; s < stages.size(); ++s)
    if (!first_used[s])
      throw std::invalid_argument("replicate: the first node of stage " + std::to_string(s) + " holds no op");
  // Stages in order of their first graph node.
  std::vector<int> first_op(stages.size(), ops);
  for (int op = ops - 1; op >= 0; --op) first_op[stage_of_node[p.node_of_op[op]]] = op;
  std::vector<int> order(stages.size());
  for (size_t s = 0; s < order.size(); ++s) order[s] = static_cast<int>(s);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return first_op[a] < first_op[b]; });
  std::vector<int> rank(stages.size());
  p.stages.clear();
  for (size_t i = 0; i < order.size(); ++i) {
    rank[order[i]] = static_cast<int>(i);
    p.stages.push_back(std::move(stages[order[i]]));
  }
  p.stage_of_op.assign(ops, -1);
  for (int op = 0; op < ops; ++op) p.stage_of_op[op] = rank[stage_of_node[p.node_of_op[op]]];
  p.routes = deal_routes(p.stages, micro_batches);
  return pipeline;
}

namespace {

// The node of every replica of `op` under `p`, replica 0 first.
std::vector<int> nodes_of(const placement& p, int op) {
  std::vector<int> out;
  for (int r = 0; r < p.replicas(op); ++r) out.push_back(p.node_of(op, r));
  return out;
}

}  // namespace

bool same_placement(const placement& a, const placement& b) {
  if (a.node_of_op.size() != b.node_of_op.size()) return false;
  if (!changed_ops(a, b).empty()) return false;
  const size_t rows = std::max<size_t>({a.routes.size(), b.routes.size(), 1});
  for (size_t op = 0; op < a.node_of_op.size(); ++op)
    for (size_t m = 0; m < rows; ++m)
      if (a.replica_of(static_cast<int>(op), static_cast<int>(m)) != b.replica_of(static_cast<int>(op), static_cast<int>(m)))
        return false;
  return true;
}

std::vector<int> changed_ops(const placement& from, const placement& to) {
  if (from.node_of_op.size() != to.node_of_op.size())
    throw std::invalid_argument("cannot compare placements of different graphs");
  std::vector<int> out;
  for (int op = 0; op < static_cast<int>(from.node_of_op.size()); ++op)
    if (nodes_of(from, op) != nodes_of(to, op)) out.push_back(op);
  return out;
}

std::vector<std::pair<int, int>> arriving_replicas(const placement& from, const placement& to) {
  std::vector<std::pair<int, int>> out;
  for (int op : changed_ops(from, to)) {
    const auto had = nodes_of(from, op);
    for (int r = 0; r < to.replicas(op); ++r)
      if (std::find(had.begin(), had.end(), to.node_of(op, r)) == had.end()) out.emplace_back(op, r);
  }
  return out;
}

namespace {

// The ops of the stage of `op` (every op on its node in a pipeline placement), inputs included.
std::vector<int> stage_members(const placement& p, int op) {
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(p.node_of_op.size()); ++k)
    if (p.stages.empty() ? p.node_of_op[k] == p.node_of_op[op] : p.stage_of(k) == p.stage_of(op)) out.push_back(k);
  return out;
}

// The ops' names for people: "h0.ln1 .. h0.res2".
std::string members_text(const graph& g, const std::vector<int>& ops) {
  std::vector<int> compute;
  for (int k : ops)
    if (!g.nodes.at(k).is_input()) compute.push_back(k);
  return format_op_runs(g, compute.empty() ? ops : compute);
}

}  // namespace

placement move_ops(const graph& g, const cluster_spec& c, placement p, const std::vector<int>& ops, int node,
                   int micro_batches) {
  for (size_t s = 0; s < p.stages.size(); ++s)
    for (size_t r = 1; r < p.stages[s].nodes.size(); ++r)
      if (p.stages[s].nodes[r] == node) {
        int first = 0;
        while (p.stage_of(first) != static_cast<int>(s)) ++first;
        throw std::invalid_argument("node '" + c.nodes.at(node).name + "' holds replica " + std::to_string(r) +
                                    " of the stage of " + members_text(g, stage_members(p, first)) +
                                    ": ops move to a node of their own or to the first node of a stage; 'replicas' "
                                    "changes a stage's replicas");
      }
  std::vector<stage_replicas> stages;
  for (auto& s : p.stages)
    if (s.nodes.size() > 1) stages.push_back(s);
  placement pipeline{p.node_of_op};
  for (int op : ops) pipeline.node_of_op.at(op) = node;
  if (stages.empty()) return pipeline;
  std::erase_if(stages, [&](const stage_replicas& s) {
    return std::find(pipeline.node_of_op.begin(), pipeline.node_of_op.end(), s.nodes[0]) == pipeline.node_of_op.end();
  });
  return replicate(std::move(pipeline), std::move(stages), micro_batches);
}

placement set_stage_replicas(const graph& g, const cluster_spec& c, placement p, int op, const std::vector<int>& nodes,
                             int micro_batches) {
  if (nodes.empty()) throw std::invalid_argument("a stage needs at least one node");
  const auto members = stage_members(p, op);
  const std::string stage_text = "the stage of " + members_text(g, members);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string name = c.nodes.at(nodes[i]).name;
    if (std::find(nodes.begin(), nodes.begin() + static_cast<long>(i), nodes[i]) != nodes.begin() + static_cast<long>(i))
      throw std::invalid_argument("node '" + name + "' is named twice");
    for (int k = 0; k < static_cast<int>(p.node_of_op.size()); ++k) {
      if (std::find(members.begin(), members.end(), k) != members.end()) continue;
      for (int r = 0; r < p.replicas(k); ++r)
        if (p.node_of(k, r) == nodes[i])
          throw std::invalid_argument("node '" + name + "' already holds " +
                                      (r == 0 ? std::string("ops") : "replica " + std::to_string(r) + " of the ops") +
                                      " of another stage (" + members_text(g, stage_members(p, k)) + "), not of " +
                                      stage_text);
    }
  }
  std::vector<stage_replicas> stages;
  for (size_t s = 0; s < p.stages.size(); ++s)
    if (p.stages[s].nodes.size() > 1 && static_cast<int>(s) != p.stage_of(op)) stages.push_back(p.stages[s]);
  placement pipeline{p.node_of_op};
  for (int k : members) pipeline.node_of_op[k] = nodes[0];
  if (nodes.size() > 1) stages.push_back({nodes, std::vector<double>(nodes.size(), 1.0)});
  if (stages.empty()) return pipeline;
  return replicate(std::move(pipeline), std::move(stages), micro_batches);
}

std::string format_replicated_stages(const graph& g, const cluster_spec& c, const placement& p) {
  std::string out;
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const auto& nodes = p.stages[s].nodes;
    if (nodes.size() < 2) continue;
    std::vector<int> ops;
    for (size_t op = 0; op < p.stage_of_op.size(); ++op)
      if (p.stage_of_op[op] == static_cast<int>(s) && !g.nodes.at(op).is_input()) ops.push_back(static_cast<int>(op));
    out += out.empty() ? "" : "; ";
    out += "ops " + format_op_runs(g, ops) + " on nodes ";
    for (size_t r = 0; r < nodes.size(); ++r) out += (r ? ", " : "") + c.nodes.at(nodes[r]).name;
  }
  return out;
}

}  // namespace fusion
