// The plan of a run: wiring a placement into cross-node edges, renumbering, diffing two plans,
// and the printable forms of plans and diffs.
#include "scheduler/plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace fusion {

namespace {

// What identifies one direction of one graph edge between two replicas across plans of the same
// graph. Forward sorts before backward, so key order is the order of plan::edges.
using edge_key = std::tuple<int, int, int, int, int>;

edge_key key_of(const plan_edge& e) {
  return {e.producer, e.consumer_index, e.producer_replica, e.consumer_replica, static_cast<int>(e.kind)};
}

bool key_less(const plan_edge& a, const plan_edge& b) { return key_of(a) < key_of(b); }

std::string op_name(const graph& g, int id) {
  if (id >= 0 && id < static_cast<int>(g.nodes.size())) return g.nodes[id].name;
  return "op #" + std::to_string(id);
}

std::string node_name(const cluster_spec& c, int k) {
  if (k >= 0 && k < static_cast<int>(c.nodes.size())) return c.nodes[k].name;
  return "node #" + std::to_string(k);
}


// "h0.res2", or "h0.res2[1]" for replica 1.
std::string replica_name(const graph& g, int op, int replica) {
  return op_name(g, op) + (replica > 0 ? "[" + std::to_string(replica) + "]" : "");
}

// "#7 fwd h0.res2 -> h1.ln1 (a1 -> b1)", "#9 fwd h0.res2 -> h1.ln1[1] (a1 -> b2)",
// "#31 reduce h0.fc -> h0.fc[1] (a1 -> a2)"
std::string edge_text(const graph& g, const cluster_spec& c, const plan_edge& e) {
  std::ostringstream out;
  out << "#" << e.id << " " << edge_kind_name(e.kind) << " " << replica_name(g, e.producer, e.producer_replica) << " -> "
      << replica_name(g, e.consumer, e.consumer_replica) << " (" << node_name(c, e.from) << " -> " << node_name(c, e.to)
      << ")";
  return out.str();
}

// Checks that stages, stage_of_op and routes of a replicated placement fit `g`.
void check_replicas(const graph& g, const placement& w) {
  if (w.stages.empty()) {
    if (!w.stage_of_op.empty() || !w.routes.empty())
      throw std::invalid_argument("cannot wire the placement: it has routes or stage indices but no stages");
    return;
  }
  auto bad = [&](const std::string& what) { throw std::invalid_argument("cannot wire the placement: " + what); };
  if (w.stage_of_op.size() != g.nodes.size()) bad("stage_of_op does not have one entry per graph node");
  if (w.routes.empty()) bad("a replicated placement has no routes");
  const int stages = static_cast<int>(w.stages.size());
  for (auto& n : g.nodes) {
    const int s = w.stage_of_op[n.id];
    if (s < 0 || s >= stages) bad("graph node '" + n.name + "' is in no stage");
    if (w.stages[s].nodes.empty() || w.stages[s].nodes[0] != w.node_of_op[n.id])
      bad("graph node '" + n.name + "' is on a node that is not replica 0 of its stage");
  }
  for (auto& row : w.routes) {
    if (static_cast<int>(row.size()) != stages) bad("a route does not name one replica per stage");
    for (int s = 0; s < stages; ++s)
      if (row[s] < 0 || row[s] >= static_cast<int>(w.stages[s].nodes.size())) bad("a route names a replica that does not exist");
  }
}

// Learnable scalars of graph node `id` (0 for inputs and ops without parameters).
int64_t param_elements(const graph& g, int id) {
  const graph_node& n = g.nodes[id];
  if (!n.impl) return 0;
  std::vector<shape_t> in;
  for (int p : n.inputs) in.push_back(g.nodes[p].shape);
  int64_t total = 0;
  for (auto& spec : n.impl->params(in)) total += numel_of(spec.shape);
  return total;
}

// "N things (a, b, c, ... and K more)": a summary stays one readable paragraph on big models.
std::string listed(size_t count, const char* one, const char* many, const std::vector<std::string>& items) {
  const size_t shown = 6;
  std::string out = std::to_string(count) + " " + (count == 1 ? one : many) + " (";
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += ", ... and " + std::to_string(items.size() - shown) + " more";
  return out + ")";
}

}  // namespace

// "1.0 MiB", or "1.0 MiB -> 160 KiB" when the codec shrinks it on the wire.
static std::string bytes_text(const plan_edge& e) {
  std::string out = human_bytes(static_cast<double>(e.bytes_per_micro_batch));
  const uint64_t wire = wire_bytes_per_micro_batch(e);
  if (wire != e.bytes_per_micro_batch) out += " -> " + human_bytes(static_cast<double>(wire));
  return out;
}

const char* edge_kind_name(edge_kind k) {
  switch (k) {
    case edge_kind::forward: return "fwd";
    case edge_kind::backward: return "bwd";
    case edge_kind::reduce: return "reduce";
  }
  return "?";
}

std::string codec_text(const edge_setting& s) { return codec_of(s.kind).describe(s); }

uint64_t wire_bytes_per_micro_batch(const plan_edge& e) {
  const codec& c = codec_of(e.setting.kind);
  const uint64_t n = e.bytes_per_micro_batch / sizeof(float);
  // A ring hop carries f32 gradient chunks: its codec (train.allreduce) applies too.
  const bool f32 = e.compressible || e.kind == edge_kind::reduce;
  return f32 && c.encodes(n, e.setting) ? c.payload_bytes(n, e.setting) : e.bytes_per_micro_batch;
}

const plan_edge* plan::find(uint64_t id) const {
  for (auto& e : edges)
    if (e.id == id) return &e;
  return nullptr;
}

const plan_edge* plan::find(int producer, int consumer_index, bool forward) const {
  return find(producer, consumer_index, forward, 0, 0);
}

const plan_edge* plan::find(int producer, int consumer_index, bool forward, int producer_replica,
                            int consumer_replica) const {
  for (auto& e : edges)
    if (e.producer == producer && e.consumer_index == consumer_index && e.kind != edge_kind::reduce &&
        e.forward() == forward && e.producer_replica == producer_replica && e.consumer_replica == consumer_replica)
      return &e;
  return nullptr;
}

const plan_edge* plan::find_reduce(int op, int replica) const {
  for (auto& e : edges)
    if (e.kind == edge_kind::reduce && e.producer == op && e.producer_replica == replica) return &e;
  return nullptr;
}

std::vector<int> plan::ops_on(int node) const {
  std::vector<int> out;
  for (auto& [op, replica] : replicas_on(node))
    if (out.empty() || out.back() != op) out.push_back(op);
  return out;
}

std::vector<std::pair<int, int>> plan::replicas_on(int node) const {
  std::vector<std::pair<int, int>> out;
  for (size_t i = 0; i < where.node_of_op.size(); ++i) {
    const int op = static_cast<int>(i);
    for (int r = 0; r < where.replicas(op); ++r)
      if (where.node_of(op, r) == node) out.emplace_back(op, r);
  }
  return out;
}

plan make_plan(const graph& g, placement where, uint64_t first_id) {
  if (where.node_of_op.size() != g.nodes.size())
    throw std::invalid_argument("cannot wire the placement: it places " + std::to_string(where.node_of_op.size()) +
                                " graph nodes but model '" + g.name + "' has " + std::to_string(g.nodes.size()));
  for (auto& n : g.nodes)
    if (where.node_of_op[n.id] < 0)
      throw std::invalid_argument("cannot wire the placement: graph node '" + n.name + "' of model '" + g.name +
                                  "' is on no cluster node (index " + std::to_string(where.node_of_op[n.id]) + ")");
  plan p;
  p.where = place_fanouts(g, std::move(where));
  check_replicas(g, p.where);
  const placement& w = p.where;
  const int rows = std::max<int>(1, static_cast<int>(w.routes.size()));
  uint64_t id = first_id;
  for (auto& n : g.nodes) {
    // Shapes are those the graph was loaded with, i.e. per micro-batch.
    const uint64_t elems = static_cast<uint64_t>(numel_of(n.shape));
    for (size_t i = 0; i < n.consumers.size(); ++i) {
      const graph_edge_end& end = n.consumers[i];
      // The replica pairs the routes join, in order; without replicas only (0, 0).
      std::set<std::pair<int, int>> pairs;
      for (int m = 0; m < rows; ++m) pairs.emplace(w.replica_of(n.id, m), w.replica_of(end.node, m));
      for (auto [ra, rb] : pairs) {
        const int a = w.node_of(n.id, ra), b = w.node_of(end.node, rb);
        if (a == b) continue;
        plan_edge fwd;
        fwd.id = id++;
        fwd.kind = edge_kind::forward;
        fwd.producer = n.id;
        fwd.consumer = end.node;
        fwd.slot = end.slot;
        fwd.consumer_index = static_cast<int>(i);
        fwd.producer_replica = ra;
        fwd.consumer_replica = rb;
        fwd.from = a;
        fwd.to = b;
        fwd.bytes_per_micro_batch = elems * dtype_size(n.type);
        fwd.compressible = n.type == dtype::f32 && elems > 0;
        plan_edge bwd = fwd;
        bwd.id = id++;
        bwd.kind = edge_kind::backward;
        bwd.from = b;
        bwd.to = a;
        // Gradients are always f32. A data input takes no gradient, so its backward direction
        // carries nothing; it is still planned because the runtime opens a sender for it.
        bwd.bytes_per_micro_batch = n.is_input() ? 0 : elems * 4;
        bwd.compressible = !n.is_input() && elems > 0;
        p.edges.push_back(fwd);
        p.edges.push_back(bwd);
      }
    }
  }
  // The gradient ring of every replicated op with parameters: replica r sends to (r + 1) % R.
  // Each hop carries 2 (R - 1) chunks of 1/R of the gradients per step (ring all-reduce).
  for (auto& n : g.nodes) {
    const int replicas = w.replicas(n.id);
    if (replicas < 2) continue;
    const int64_t elems = param_elements(g, n.id);
    if (elems == 0) continue;
    for (int r = 0; r < replicas; ++r) {
      const int a = w.node_of(n.id, r), b = w.node_of(n.id, (r + 1) % replicas);
      if (a == b) continue;
      plan_edge e;
      e.id = id++;
      e.kind = edge_kind::reduce;
      e.producer = e.consumer = n.id;
      e.producer_replica = r;
      e.consumer_replica = (r + 1) % replicas;
      e.from = a;
      e.to = b;
      e.bytes_per_micro_batch =
          static_cast<uint64_t>(elems) * 4 * 2 * static_cast<uint64_t>(replicas - 1) / static_cast<uint64_t>(replicas);
      e.compressible = false;  // not for AdaTopK or `compress`: its codec is train.allreduce's
      p.edges.push_back(e);
    }
  }
  p.next_edge_id = id;
  return p;
}

plan plan_run(const graph& g, const cluster_spec& c, const cluster_profile& profile, uint64_t first_id) {
  return make_plan(g, place_ops(g, c, profile), first_id);
}

plan renumber(plan p, uint64_t first_id) {
  uint64_t id = first_id;
  for (auto& e : p.edges) e.id = id++;
  p.next_edge_id = id;
  return p;
}

plan replan(const graph& g, const plan& before, placement where) {
  plan after = make_plan(g, std::move(where), before.next_edge_id);
  after.schedule = before.schedule;
  std::map<edge_key, const plan_edge*> old_edges;
  for (auto& e : before.edges) old_edges[key_of(e)] = &e;
  for (auto& e : after.edges) {
    auto it = old_edges.find(key_of(e));
    if (it == old_edges.end() || it->second->from != e.from || it->second->to != e.to) continue;
    e.id = it->second->id;
    e.setting = it->second->setting;
  }
  return after;
}

plan_diff diff(const plan& before, const plan& after) {
  if (before.where.node_of_op.size() != after.where.node_of_op.size())
    throw std::invalid_argument("cannot compare plans of different graphs: one places " +
                                std::to_string(before.where.node_of_op.size()) + " graph nodes, the other " +
                                std::to_string(after.where.node_of_op.size()));
  plan_diff d;
  for (size_t i = 0; i < before.where.node_of_op.size(); ++i) {
    int a = before.where.node_of_op[i], b = after.where.node_of_op[i];
    if (a == b) continue;
    d.moved_ops.push_back(static_cast<int>(i));
    d.moves.emplace_back(a, b);
  }
  const placement &wb = before.where, &wa = after.where;
  const size_t rows = std::max<size_t>({wb.routes.size(), wa.routes.size(), 1});
  for (size_t i = 0; i < wb.node_of_op.size(); ++i) {
    const int op = static_cast<int>(i);
    const int rb = wb.replicas(op), ra = wa.replicas(op);
    for (int r = 1; r < std::max(rb, ra); ++r) {
      replica_change ch{op, r, r < rb ? wb.node_of(op, r) : -1, r < ra ? wa.node_of(op, r) : -1};
      if (ch.from != ch.to) d.replicas.push_back(ch);
    }
    for (size_t m = 0; m < rows && !d.routes_changed; ++m)
      d.routes_changed = wb.replica_of(op, static_cast<int>(m)) != wa.replica_of(op, static_cast<int>(m));
  }
  std::map<edge_key, const plan_edge*> old_edges, new_edges;
  for (auto& e : before.edges) old_edges[key_of(e)] = &e;
  for (auto& e : after.edges) new_edges[key_of(e)] = &e;
  for (auto& [k, e] : old_edges) {
    auto it = new_edges.find(k);
    if (it == new_edges.end()) {
      d.removed.push_back(*e);
      continue;
    }
    const plan_edge& n = *it->second;
    if (e->from != n.from || e->to != n.to) {
      // Other ends: the old sender goes away and a new one is opened.
      d.removed.push_back(*e);
      d.added.push_back(n);
    } else if (e->id != n.id || !(e->setting == n.setting)) {
      d.changed.emplace_back(*e, n);
    }
  }
  for (auto& [k, e] : new_edges)
    if (!old_edges.count(k)) d.added.push_back(*e);
  std::sort(d.added.begin(), d.added.end(), key_less);
  std::sort(d.removed.begin(), d.removed.end(), key_less);
  // changed is already in key order (old_edges is a sorted map).
  return d;
}

std::string format_diff(const graph& g, const cluster_spec& c, const plan_diff& d) {
  if (d.empty()) return "no change";
  std::vector<std::string> parts;
  if (!d.moved_ops.empty()) {
    std::vector<std::string> items;
    for (size_t i = 0; i < d.moved_ops.size(); ++i) {
      std::string item = op_name(g, d.moved_ops[i]);
      if (i < d.moves.size()) item += ": " + node_name(c, d.moves[i].first) + " -> " + node_name(c, d.moves[i].second);
      items.push_back(item);
    }
    parts.push_back(listed(d.moved_ops.size(), "op moves", "ops move", items));
  }
  if (!d.replicas.empty()) {
    std::vector<std::string> items;
    for (auto& ch : d.replicas)
      items.push_back(replica_name(g, ch.op, ch.replica) + ": " + (ch.from < 0 ? "new" : node_name(c, ch.from)) +
                      " -> " + (ch.to < 0 ? "gone" : node_name(c, ch.to)));
    parts.push_back(listed(d.replicas.size(), "replica changes", "replicas change", items));
  }
  if (d.routes_changed) parts.push_back("micro-batches take other routes");
  auto edge_list = [&](const std::vector<plan_edge>& edges, const char* what) {
    std::vector<std::string> items;
    for (auto& e : edges) items.push_back(edge_text(g, c, e));
    parts.push_back(listed(edges.size(), (std::string("edge ") + what).c_str(), (std::string("edges ") + what).c_str(),
                           items));
  };
  if (!d.added.empty()) edge_list(d.added, "added");
  if (!d.removed.empty()) edge_list(d.removed, "removed");
  if (!d.changed.empty()) {
    std::vector<std::string> items;
    for (auto& [o, n] : d.changed) {
      std::string item = edge_text(g, c, o);
      if (o.id != n.id) item += " becomes #" + std::to_string(n.id);
      if (!(o.setting == n.setting)) item += ", codec " + codec_text(o.setting) + " -> " + codec_text(n.setting);
      items.push_back(item);
    }
    parts.push_back(listed(d.changed.size(), "edge changed", "edges changed", items));
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out + ".";
}

std::string format_plan(const graph& g, const cluster_spec& c, const plan& p) {
  for (size_t i = 0; i < p.where.node_of_op.size(); ++i)
    if (p.where.node_of_op[i] < 0 || p.where.node_of_op[i] >= static_cast<int>(c.nodes.size()))
      throw std::invalid_argument("cannot print the plan: graph node '" + op_name(g, static_cast<int>(i)) +
                                  "' is placed on node index " + std::to_string(p.where.node_of_op[i]) +
                                  ", but cluster '" + c.name + "' has " + std::to_string(c.nodes.size()) + " nodes");
  std::ostringstream out;
  out << format_placement(g, c, p.where);
  if (p.edges.empty()) {
    out << "edges: none (every op runs on one node)\n";
    return out.str();
  }
  const bool rings = std::any_of(p.edges.begin(), p.edges.end(), [](auto& e) { return e.kind == edge_kind::reduce; });
  out << "edges: " << p.edges.size() << " cross-node directions, bytes per micro-batch of B=" << g.batch
      << (rings ? " (reduce: gradient ring hops, bytes per step)" : "") << "\n";
  struct row {
    std::string id, dir, ops, nodes, bytes, codec;
  };
  std::vector<row> rows{{"id", "dir", "producer -> consumer", "from -> to", "bytes", "codec"}};
  for (auto& e : p.edges)
    rows.push_back({std::to_string(e.id), edge_kind_name(e.kind),
                    replica_name(g, e.producer, e.producer_replica) + " -> " + replica_name(g, e.consumer, e.consumer_replica),
                    node_name(c, e.from) + " -> " + node_name(c, e.to),
                    bytes_text(e), codec_text(e.setting)});
  // Column widths from the contents: op and node names vary in length by model and cluster.
  size_t w[5] = {0, 0, 0, 0, 0};
  for (auto& r : rows) {
    w[0] = std::max(w[0], r.id.size());
    w[1] = std::max(w[1], r.dir.size());
    w[2] = std::max(w[2], r.ops.size());
    w[3] = std::max(w[3], r.nodes.size());
    w[4] = std::max(w[4], r.bytes.size());
  }
  auto pad = [](const std::string& s, size_t n) { return s + std::string(n > s.size() ? n - s.size() : 0, ' '); };
  for (auto& r : rows)
    out << "  " << pad(r.id, w[0]) << "  " << pad(r.dir, w[1]) << "  " << pad(r.ops, w[2]) << "  " << pad(r.nodes, w[3])
        << "  " << std::string(w[4] - r.bytes.size(), ' ') << r.bytes << "  " << r.codec << "\n";
  return out.str();
}

}  // namespace fusion
