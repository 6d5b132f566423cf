// Pipeline schedules (docs/scheduler.md, section 5): when a stage may start a forward or a
// backward. Eager (the runtime's schedule before schedules existed) runs whatever is ready:
// forwards as their inputs arrive, a backward once its gradients are in. GPipe runs every forward
// of a step before any backward on each op actor. 1F1B lets at most (stages - position)
// micro-batches of activations be alive on a stage, so each stage runs the backward of micro-batch
// i before the forward of i + (stages - position). All of them run every op's backward in
// micro-batch order, so the accumulated gradients (and the losses) are the same. The op actors
// enforce the rule (core/live_gate.hpp), the estimator simulates it; this file says what the rule
// is for a placement and picks a schedule from the estimator's predictions. Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/graph.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

class workload_estimator;
struct plan;
struct step_estimate;

/// How a pipeline interleaves forwards and backwards.
enum class pipeline_schedule : uint8_t {
  eager = 0,        ///< whatever is ready runs: every micro-batch's activations may be alive
  gpipe = 1,        ///< every forward of the step before any backward, per op actor
  one_f_one_b = 2,  ///< at most (stages - position) micro-batches alive per stage
};

/// The schedules in the order `auto` prefers them on a tie (least activation memory first).
inline constexpr pipeline_schedule all_schedules[] = {pipeline_schedule::one_f_one_b, pipeline_schedule::eager,
                                                      pipeline_schedule::gpipe};

/// "eager", "gpipe" or "1f1b".
const char* schedule_name(pipeline_schedule s);

/// Parses "eager", "gpipe" or "1f1b" (not "auto", which the caller resolves); false for
/// anything else.
bool parse_schedule(const std::string& text, pipeline_schedule& out);

/// The pipeline position of every graph node under a placement.
struct pipeline_positions {
  int stages = 1;               ///< pipeline stages (a replicated stage counts once)
  std::vector<int> position;    ///< per graph node: 0 .. stages - 1; -1 for data inputs
};

/// Stages and positions of `where`: with stage replicas, the stage index (stages are in order
/// of their first graph node); without, cluster nodes holding compute ops in order of their
/// first compute op (graph order), one stage each.
pipeline_positions positions_of(const graph& g, const placement& where);

/// Per graph node, how many micro-batches of activations its op actor may hold at once under
/// `s`: under 1F1B stages - position (at least 1); 0 (no bound) otherwise and for data inputs.
std::vector<int> live_limits(const graph& g, const placement& where, pipeline_schedule s);

/// What the estimator predicts for every schedule of one plan, and the one it picks.
struct schedule_choice {
  pipeline_schedule chosen = pipeline_schedule::eager;
  double step_s[3] = {0, 0, 0};      ///< predicted step time, by pipeline_schedule value
  double peak_bytes[3] = {0, 0, 0};  ///< the most memory any node needs, by pipeline_schedule value
  std::string reason;                ///< one line for people
  double step_of(pipeline_schedule s) const { return step_s[static_cast<int>(s)]; }
};

/// Simulates `p` under every schedule and picks the fastest; on a tie, the one with less
/// activation memory (all_schedules' order). With one stage it keeps eager: 1F1B would run the
/// micro-batches one at a time, while the op actors of one process work on several at once
/// (which the simulation, one op at a time per node, does not see).
schedule_choice choose_schedule(const workload_estimator& est, const plan& p);

/// Sets `p.schedule` to the one choose_schedule picks (what train.schedule=auto runs) and
/// returns that schedule's simulated step: how planners judge a candidate plan, so that a plan
/// 1F1B makes fastest is not judged by eager's time.
step_estimate simulate_fastest_schedule(const workload_estimator& est, plan& p);

/// The step a run of `p` takes under `fixed` (train.schedule, or the schedule a running plan
/// keeps), with p.schedule set to it; simulate_fastest_schedule when `fixed` is empty (auto).
step_estimate simulate_schedule(const workload_estimator& est, plan& p, std::optional<pipeline_schedule> fixed);

/// "predicted step 0.41 s under 1f1b (peak node memory 61 MiB), 0.40 s under eager (88 MiB),
/// 0.48 s under gpipe (88 MiB)".
std::string format_predictions(const schedule_choice& c);

}  // namespace fusion
