// train.micro-batches = auto in a run (scheduler/micro_batches.hpp has the choice): a cluster
// run chooses in the coordinator once the nodes are profiled, before the plan is made; a
// one-process run chooses before its model is loaded, from its own op times. Both print one
// line: the choice, why, and every candidate's predicted step.
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "actors/coordinator_state.hpp"
#include "actors/micro_batches_auto.hpp"
#include "core/log.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/op_timing.hpp"

namespace fusion {

namespace {

void print_choice(const train_config& cfg, const micro_batch_choice& c, const std::string& basis) {
  if (!cfg.progress) return;
  std::fprintf(stderr, "fusion-train: micro-batches %lld (auto, %s): %s; predicted step %s\n",
               static_cast<long long>(c.chosen), basis.c_str(), c.reason.c_str(), format_candidates(c).c_str());
}

}  // namespace

void choose_run_micro_batches(coord_ptr self) {
  auto& st = self->state;
  train_config& cfg = st.in->cfg;
  if (!cfg.micro_batches_auto || st.in->cluster.nodes.empty()) return;
  const micro_batch_choice c = choose_micro_batches(
      cfg.batch, st.in->model, st.in->cluster, st.exec.profile,
      [&](int64_t rows) { return load_graph(cfg.model_file, rows); },
      [&](const workload_estimator& est, const cluster_profile& prof) {
        return plan_compressed_run(est, prof, cfg.compression, 1, nullptr, fixed_schedule(cfg));
      },
      fixed_schedule(cfg), estimator_options{});
  print_choice(cfg, c, "op times measured at " + std::to_string(cfg.micro_batches) + " micro-batches, moved by the "
                       "GEMM-efficiency model");
  if (c.chosen == cfg.micro_batches) return;
  // The model at the chosen shapes; the profile follows it, the estimator is rebuilt from it.
  graph g = load_graph(cfg.model_file, cfg.batch / c.chosen);
  st.exec.profile = rescale_profile(st.exec.profile, st.in->model, g, static_cast<int>(c.chosen));
  st.in->model = std::move(g);
  cfg.micro_batches = c.chosen;
  st.exec.micro_rows = cfg.batch / c.chosen;
  st.exec.estimator.reset();
}

int64_t choose_local_micro_batches(const train_config& cfg) {
  // One node, this process's device, every op timed here at the reference micro-batch.
  const cluster_spec one = parse_cluster("name: \"local\"\nsite { name: \"here\" }\nnode { name: \"local\" site: \"here\" "
                                         "device: \"" + cfg.device + "\" }\n",
                                         "(one-process run)");
  const graph measured = load_graph(cfg.model_file, cfg.batch / cfg.micro_batches);
  cluster_profile p = profile_from_cluster(one);
  p.micro_batches = static_cast<int>(cfg.micro_batches);
  p.micro_batch = measured.batch;
  const device_timing t = time_ops(cfg.device, op_signatures(measured));
  p.nodes[0].memory_bytes = t.memory_bytes;
  take_measured(p.nodes[0], t);
  const micro_batch_choice c = choose_micro_batches(
      cfg.batch, measured, one, p, [&](int64_t rows) { return load_graph(cfg.model_file, rows); },
      [&](const workload_estimator& est, const cluster_profile&) {
        return make_plan(est.model(), placement{std::vector<int>(est.model().nodes.size(), 0)}, 1);
      },
      pipeline_schedule::eager, estimator_options{});
  char basis[160];
  std::snprintf(basis, sizeof basis, "one process, op times measured here in %.2g s at %lld micro-batches",
                t.seconds, static_cast<long long>(cfg.micro_batches));
  print_choice(cfg, c, basis);
  return c.chosen;
}

}  // namespace fusion
