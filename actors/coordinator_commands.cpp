// The admin commands (actors/admin_protocol.hpp, docs/admin.md): each is checked here and
// answered with a JSON object or a bad_command / wrong_phase error in plain words. Work that
// must not overlap a step (moves, checkpoints, rebalancing) runs at once between steps, or is
// queued for the next step boundary while a step runs.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>

#include "actors/coordinator_state.hpp"
#include "core/log.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

namespace {

caf::error bad(const std::string& what) { return make_error(fusion_errc::bad_command, what); }

bool can_change(const coordinator_state& st) {
  return st.phase == run_phase::ready || st.phase == run_phase::training || st.phase == run_phase::paused;
}

caf::result<std::string> now_or_at_boundary(coord_ptr self,
                                            std::function<void(caf::response_promise, std::function<void()>)> work) {
  auto rp = self->make_response_promise();
  run_or_queue(self, rp, std::move(work));
  return rp;
}

// The ops `pattern` names (a name or a glob); fails in plain words when it names none.
result<std::vector<int>> ops_matching(const graph& g, const std::string& pattern) {
  std::vector<int> ops;
  for (auto& n : g.nodes)
    if (glob_match(pattern, n.name)) ops.push_back(n.id);
  if (ops.empty())
    return fusion::fail("no op of model " + g.name + " matches '" + pattern + "' (see the 'placement' query)");
  return ops;
}

std::string node_names(const cluster_spec& c) {
  std::string names;
  for (auto& n : c.nodes) names += (names.empty() ? "" : ", ") + n.name;
  return names;
}

caf::result<std::string> command_move(coord_ptr self, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (args.size() != 2) return bad("usage: move OP|GLOB NODE");
  if (st.in->cluster.nodes.empty()) return bad("this run has no cluster: there is no other node to move ops to");
  auto matched = ops_matching(st.in->model, args[0]);
  if (!matched) return bad(matched.error());
  const std::vector<int>& ops = *matched;
  int node = st.in->cluster.find_node(args[1]);
  if (node < 0) return bad("unknown node '" + args[1] + "' (nodes: " + node_names(st.in->cluster) + ")");
  if (!can_change(st))
    return make_error(fusion_errc::wrong_phase, std::string("cannot move ops while the run is ") + to_string(st.phase));
  caf::error err;
  // Checked now for a prompt answer, and again when it runs (run_move). While a recovery
  // replaces the plan, only then: the plan of now still holds the lost node.
  if (st.act != activity::recovering && !check_move(self, ops, node, err)) return err;
  return now_or_at_boundary(self, [=](caf::response_promise rp, std::function<void()> next) {
    run_move(self, ops, node, rp, next);
  });
}

// replicas OP NODE[,NODE...]: the nodes that hold the stage of OP, its first node first.
caf::result<std::string> command_replicas(coord_ptr self, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (args.size() != 2) return bad("usage: replicas OP NODE[,NODE...] (the first node holds the stage, the others replicas)");
  if (st.in->cluster.nodes.empty()) return bad("this run has no cluster: there is no other node to hold replicas");
  const int op = st.in->model.find(args[0]);
  if (op < 0) return bad("no op of model " + st.in->model.name + " is named '" + args[0] + "' (see the 'placement' query)");
  std::vector<int> nodes;
  size_t at = 0;
  while (at <= args[1].size()) {
    const size_t comma = std::min(args[1].find(',', at), args[1].size());
    const std::string name = args[1].substr(at, comma - at);
    const int node = st.in->cluster.find_node(name);
    if (node < 0) return bad("unknown node '" + name + "' (nodes: " + node_names(st.in->cluster) + ")");
    nodes.push_back(node);
    at = comma + 1;
  }
  if (!can_change(st))
    return make_error(fusion_errc::wrong_phase, std::string("cannot change replicas while the run is ") + to_string(st.phase));
  caf::error err;
  if (st.act != activity::recovering && !check_set_replicas(self, op, nodes, err)) return err;  // as for move
  return now_or_at_boundary(self, [=](caf::response_promise rp, std::function<void()> next) {
    run_set_replicas(self, op, nodes, rp, next);
  });
}

caf::result<std::string> command_checkpoint(coord_ptr self, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (args.size() > 1) return bad("usage: checkpoint [FILE]");
  std::string path = args.empty() ? st.in->cfg.checkpoint_file : args[0];
  if (path.empty())
    return bad("this run has no output.checkpoint file: name one, e.g. 'checkpoint runs/now.ckpt'");
  if (!can_change(st))
    return make_error(fusion_errc::wrong_phase, std::string("cannot checkpoint while the run is ") + to_string(st.phase));
  return now_or_at_boundary(self, [=](caf::response_promise rp, std::function<void()> next) mutable {
    save_checkpoint_async(
        self, path,
        [=]() mutable {
          rp.deliver(json{{"checkpoint", path}, {"step", self->state.train.step}}.dump());
          next();
        },
        [=](const std::string& why) mutable {
          rp.deliver(bad("cannot write checkpoint " + path + ": " + why));
          next();
        });
  });
}

// compress EDGE none|RATIO|auto: the codec of one edge direction from its next tensor on.
caf::result<std::string> command_compress(coord_ptr self, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (args.size() != 2) return bad("usage: compress EDGE none|RATIO|auto (EDGE: an edge id of the 'placement' query)");
  char* end = nullptr;
  const uint64_t id = std::strtoull(args[0].c_str(), &end, 10);
  plan_edge* e = nullptr;
  for (auto& pe : st.exec.current.edges)
    if (pe.id == id) e = &pe;
  if (args[0].empty() || *end != '\0' || !e)
    return bad("no edge '" + args[0] + "' in the current plan (the 'placement' query lists the edge ids)");
  if (e->kind == edge_kind::reduce)
    return bad("edge " + args[0] + " is a hop of a gradient all-reduce ring: its codec is train.allreduce's (f32 or "
               "f16), set when the run starts");
  if (!e->compressible) return bad("edge " + args[0] + " carries token ids, which are never compressed");
  const auto& c = st.in->cfg.compression;
  const std::string& how = args[1];
  if (how == "auto") {
    if (!codec_of(c.mode).adaptive())
      return bad("'auto' hands the edge to AdaTopK, which this run does not use (compression.mode=" +
                 to_string(c.mode) + ")");
    st.exec.pinned_edges.erase(id);
    return json{{"edge", id}, {"codec", "auto"}}.dump();
  }
  pinned_codec pin;  // none
  if (how != "none") {
    double ratio = std::strtod(how.c_str(), &end);
    if (how.empty() || *end != '\0' || !(ratio > 0 && ratio <= 1))
      return bad("compress: '" + how + "' is not none, auto or a keep ratio in (0, 1], e.g. 0.1");
    pin = {codec_kind::topk, ratio};
  }
  const codec_settings s = codec_for_edge(*e, c, {std::nullopt, pin});
  e->setting = s;
  st.exec.pinned_edges.insert(id);
  if (auto it = st.exec.senders.find(id); it != st.exec.senders.end()) self->send(it->second, compress_atom::value, s);
  if (st.train.metrics.is_open())
    st.train.metrics << json{{"type", "compression"}, {"step", st.train.step}, {"edge", id}, {"codec", codec_text(s)},
                       {"reason", "admin"}}
                      .dump()
               << "\n"
               << std::flush;
  return json{{"edge", id}, {"codec", codec_text(s)}}.dump();
}

}  // namespace

caf::result<std::string> run_command(coord_ptr self, const std::string& verb, const std::vector<std::string>& args) {
  if ((verb == "pause" || verb == "resume") && !args.empty()) return bad("'" + verb + "' takes no arguments");
  if (verb == "pause") {
    auto rp = self->make_response_promise();
    request_pause(self, rp);
    return rp;
  }
  if (verb == "resume") {
    caf::error err;
    auto out = request_resume(self, err);
    if (err) return err;
    return out;
  }
  if (verb == "move") return command_move(self, args);
  if (verb == "replicas") return command_replicas(self, args);
  if (verb == "checkpoint") return command_checkpoint(self, args);
  if (verb == "compress") return command_compress(self, args);
  if (verb == "drain") return command_drain(self, args);
  if (auto r = scheduler_command(self, verb, args)) return std::move(*r);
  return bad("unknown command '" + verb + "'");
}

void run_or_queue(coord_ptr self, caf::response_promise rp,
                  std::function<void(caf::response_promise, std::function<void()>)> work) {
  auto& st = self->state;
  const bool wait = st.phase == run_phase::training || st.act != activity::idle || !st.rebalance.at_boundary.empty();
  st.rebalance.at_boundary.push_back({[=](std::function<void()> next) { work(rp, next); },
                                      [=](const caf::error& e) mutable { rp.deliver(e); }});
  // Otherwise it runs now, as a boundary task (a node lost meanwhile answers it: refuse_running_task),
  // and work queued meanwhile (a second command during this one) follows it.
  if (!wait) run_boundary_tasks(self, [] {});
}

void run_boundary_tasks(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  // During a recovery the tasks wait for its end (finish() or the next step starts them again):
  // a task run on the plan being given up would ask the lost node's actors.
  if (st.rebalance.at_boundary.empty() || st.phase == run_phase::failed || st.recovery.ctx) return done();
  auto task = std::move(st.rebalance.at_boundary.front());
  st.rebalance.at_boundary.erase(st.rebalance.at_boundary.begin());
  const uint64_t token = ++st.rebalance.task_token;
  st.rebalance.running = task.refuse;
  task.run([=] {
    auto& rb = self->state.rebalance;
    if (rb.task_token != token) return;  // refused by a recovery meanwhile: its chain ended there
    rb.running = nullptr;
    run_boundary_tasks(self, done);
  });
}

void refuse_running_task(coord_ptr self, const caf::error& why) {
  auto& rb = self->state.rebalance;
  ++rb.task_token;
  if (auto refuse = std::exchange(rb.running, nullptr)) refuse(why);
}

void refuse_boundary_tasks(coord_ptr self, const caf::error& why) {
  auto tasks = std::move(self->state.rebalance.at_boundary);
  self->state.rebalance.at_boundary.clear();
  for (auto& t : tasks) t.refuse(why);
}

}  // namespace fusion
