#include "scheduler/schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

const char* schedule_name(pipeline_schedule s) {
  switch (s) {
    case pipeline_schedule::gpipe: return "gpipe";
    case pipeline_schedule::one_f_one_b: return "1f1b";
    default: return "eager";
  }
}

bool parse_schedule(const std::string& text, pipeline_schedule& out) {
  for (auto s : all_schedules)
    if (text == schedule_name(s)) return out = s, true;
  return false;
}

pipeline_positions positions_of(const graph& g, const placement& where) {
  pipeline_positions out;
  const int n = static_cast<int>(g.nodes.size());
  out.position.assign(static_cast<size_t>(n), -1);
  // A stage (or, without replicas, a node) is ranked by its first compute op in graph order.
  std::map<int, int> first_op;  // stage or node -> first compute op
  auto group_of = [&](int id) { return where.stages.empty() ? where.node_of_op.at(id) : where.stage_of(id); };
  for (int id = 0; id < n; ++id)
    if (!g.nodes[id].is_input()) first_op.emplace(group_of(id), id);
  std::vector<std::pair<int, int>> order;  // (first op, group)
  for (auto& [group, op] : first_op) order.emplace_back(op, group);
  std::sort(order.begin(), order.end());
  std::map<int, int> rank;
  for (size_t i = 0; i < order.size(); ++i) rank[order[i].second] = static_cast<int>(i);
  out.stages = std::max<int>(1, static_cast<int>(order.size()));
  for (int id = 0; id < n; ++id)
    if (!g.nodes[id].is_input()) out.position[id] = rank.at(group_of(id));
  return out;
}

std::vector<int> live_limits(const graph& g, const placement& where, pipeline_schedule s) {
  std::vector<int> out(g.nodes.size(), 0);
  if (s != pipeline_schedule::one_f_one_b) return out;
  const pipeline_positions pos = positions_of(g, where);
  for (size_t id = 0; id < out.size(); ++id)
    if (pos.position[id] >= 0) out[id] = std::max(1, pos.stages - pos.position[id]);
  return out;
}

namespace {

// auto's rule among simulated step times (by pipeline_schedule value): the fastest; a tie (to
// rounding) goes to the one earlier in all_schedules (less activation memory first).
pipeline_schedule fastest_schedule(const double (&step_s)[3]) {
  pipeline_schedule chosen = all_schedules[0];
  for (auto s : all_schedules)
    if (step_s[static_cast<int>(s)] < step_s[static_cast<int>(chosen)] * (1 - 1e-9)) chosen = s;
  return chosen;
}

}  // namespace

schedule_choice choose_schedule(const workload_estimator& est, const plan& p) {
  schedule_choice c;
  plan trial = p;
  for (auto s : all_schedules) {
    trial.schedule = s;
    const step_estimate e = est.simulate(trial);
    const int i = static_cast<int>(s);
    c.step_s[i] = e.step_s;
    c.peak_bytes[i] = e.node_memory_bytes.empty()
                          ? 0.0
                          : *std::max_element(e.node_memory_bytes.begin(), e.node_memory_bytes.end());
  }
  if (positions_of(est.model(), p.where).stages < 2) {
    c.chosen = pipeline_schedule::eager;
    c.reason = "one pipeline stage, where 1F1B would run the micro-batches one at a time";
    return c;
  }
  c.chosen = fastest_schedule(c.step_s);
  c.reason = std::string(schedule_name(c.chosen)) + " is predicted fastest" +
             (c.chosen == pipeline_schedule::one_f_one_b ? " (or tied) and holds the least activation memory" : "");
  return c;
}

step_estimate simulate_fastest_schedule(const workload_estimator& est, plan& p) {
  // choose_schedule's choice, keeping the chosen schedule's whole estimate; one stage keeps
  // eager without simulating the others.
  if (positions_of(est.model(), p.where).stages < 2) {
    p.schedule = pipeline_schedule::eager;
    return est.simulate(p);
  }
  step_estimate runs[3];
  double step_s[3];
  for (auto s : all_schedules) {
    p.schedule = s;
    const int i = static_cast<int>(s);
    runs[i] = est.simulate(p);
    step_s[i] = runs[i].step_s;
  }
  p.schedule = fastest_schedule(step_s);
  return std::move(runs[static_cast<int>(p.schedule)]);
}

step_estimate simulate_schedule(const workload_estimator& est, plan& p, std::optional<pipeline_schedule> fixed) {
  if (!fixed) return simulate_fastest_schedule(est, p);
  p.schedule = *fixed;
  return est.simulate(p);
}

std::string format_predictions(const schedule_choice& c) {
  std::string out = "predicted step";
  char part[160];
  for (auto s : all_schedules) {
    std::snprintf(part, sizeof part, "%s %.4g s under %s (peak node memory %s)", out.size() > 14 ? "," : "",
                  c.step_of(s), schedule_name(s), human_bytes(c.peak_bytes[static_cast<int>(s)]).c_str());
    out += part;
  }
  return out;
}

}  // namespace fusion
