// The coordinator's training work, as reactions to messages: a step feeds the micro-batches,
// collects losses and gradient norms, steps the optimizer on every op actor, polls the nodes'
// traffic and logs; checkpoints are passes of the same kind (evaluation and sampling:
// actors/coordinator_eval.cpp). Between steps it honours pause, re-wiring and stop requests.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <random>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "actors/coordinator_state.hpp"
#include "core/checkpoint.hpp"
#include "core/checkpoint_dir.hpp"
#include "core/log.hpp"
#include "ops/optim.hpp"

namespace fusion {

using json = nlohmann::ordered_json;

namespace {

void log_metrics(coordinator_state& st, const std::string& line) {
  if (st.train.metrics.is_open()) st.train.metrics << line << '\n' << std::flush;
}

bool tty(const coordinator_state& st) { return st.in->cfg.progress && isatty(STDERR_FILENO); }

// Where a diverged run's last good state is: the checkpoint written last ("FILE at step N";
// save_checkpoint_async never writes non-finite values), else what output.checkpoint holds.
std::string last_good_state(const coordinator_state& st) {
  const std::string& last = st.train.last_checkpoint;
  if (auto at = last.rfind(" at step "); at != std::string::npos)
    return "the checkpoint of step " + last.substr(at + 9) + " in " + last.substr(0, at) + " is the last good state";
  const std::string& file = st.in->cfg.checkpoint_file;
  if (file.empty()) return "no checkpoint is kept (output.checkpoint is not set)";
  return "no checkpoint was written in this run; " + file + " is left as it was";
}


void end_step(coord_ptr self, step_record rec);

// A validation loss: kept in the result, written to the metrics and shown (NaN: none ran).
void record_eval(coord_ptr self, eval_result v) {
  if (std::isnan(v.loss)) return;
  auto& s = self->state;
  add_eval_record(s.in->result, s.train.step, v);
  log_metrics(s, eval_metrics_line(s.train.step, v, metrics_time()));
  char extra[96] = "";
  int used = 0;
  if (!std::isnan(v.bits_per_byte)) used = std::snprintf(extra, sizeof extra, " | val_bpb %.4f", v.bits_per_byte);
  if (!std::isnan(v.accuracy))
    std::snprintf(extra + used, sizeof extra - static_cast<size_t>(used), " | val_accuracy %.2f%%", 100 * v.accuracy);
  if (s.in->cfg.progress)
    std::fprintf(stderr, "%sstep %lld | val_loss %.4f%s\n", tty(s) ? "\r\33[K" : "", static_cast<long long>(s.train.step),
                 v.loss, extra);
}

// A node's CPU quota changed while the run trains (sites.sh throttle, a co-tenant's cgroup): its
// op times under a binding quota are CPU times, which the change leaves alone, so without this
// the estimator, and the scheduler with it, would never see the node slow down or speed up.
void follow_quota(coord_ptr self, int node, const cpu_quota& now) {
  auto& st = self->state;
  auto* est = estimator_of(self);
  if (!est || node < 0 || static_cast<size_t>(node) >= est->profile().nodes.size()) return;
  const cpu_quota before = est->profile().nodes[node].quota;
  if (!est->set_quota(node, now)) return;
  // What the estimator kept (a quota of a core or more is kept as none), so the two agree.
  const cpu_quota kept = est->profile().nodes[node].quota;
  if (st.exec.profile.nodes.size() == est->profile().nodes.size()) st.exec.profile.nodes[node].quota = kept;
  auto words = [](const cpu_quota& q) {
    char text[64];
    if (q.cores > 0)
      std::snprintf(text, sizeof text, "%.2f core per %.0f ms", q.cores, q.period_s * 1e3);
    else
      std::snprintf(text, sizeof text, "none");
    return std::string(text);
  };
  log_info("fusion-train", node_label(st, node) + ": CPU quota now " + words(kept) + " (was " + words(before) +
                               ") at step " + std::to_string(st.train.step) + ": the estimator follows");
}

// Edge traffic of the step that just ended, from every node, then end_step.
void poll_traffic(coord_ptr self, step_record rec) {
  auto& st = self->state;
  std::vector<node_actor> live;
  std::vector<int> live_index;
  for (size_t k = 0; k < st.members.nodes.size(); ++k)
    if (auto& n = st.members.nodes[k]) live.push_back(n), live_index.push_back(static_cast<int>(k));
  st.act = activity::polling;
  arm_timeout(self, st.in->cfg.step_timeout_s);  // not per request: see optimizer_step
  auto recp = std::make_shared<step_record>(std::move(rec));
  gather<node_stats>(self, live.size(),
                     [=](size_t i) { return self->request(live[i], caf::infinite, stats_atom::value); },
                     [=](std::vector<node_stats> all) {
                       auto& s = self->state;
                       auto& out = recp->edges;
                       for (size_t i = 0; i < all.size(); ++i) {
                         recp->nodes.push_back({s.in->cluster.nodes[live_index[i]].name, all[i].cpu_s});
                         follow_quota(self, live_index[i], {all[i].quota_cores, all[i].quota_period_s});
                       }
                       for (auto& ns : all)
                         for (auto& e : ns.edges) {
                           const plan_edge* info = s.exec.current.find(e.edge);
                           if (!info) continue;  // an edge of a plan that is gone (re-wired)
                           // Gradient ring hops are not activations or gradients of a graph
                           // edge: the record keeps them apart, for the estimator's links.
                           auto& into = info->kind == edge_kind::reduce ? recp->reduce_edges : out;
                           into.push_back({info->producer, info->consumer, info->forward(),
                                          s.in->cluster.nodes[info->from].name, s.in->cluster.nodes[info->to].name,
                                          e.bytes, e.dense_bytes, e.tensors, e.seconds, e.encode_s,
                                          e.keep_ratio, e.idle_starts});
                         }
                       std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
                         return std::tie(a.producer, a.consumer, b.forward) < std::tie(b.producer, b.consumer, a.forward);
                       });
                       end_step(self, std::move(*recp));
                     });
}

void optimizer_step(coord_ptr self) {
  auto& st = self->state;
  auto& c = *st.train.cur;
  auto& rec = c.rec;
  std::sort(rec.ops.begin(), rec.ops.end(), [](auto& a, auto& b) { return a.node < b.node; });
  rec.step = st.train.step + 1;
  rec.loss = c.machine.mean_loss();
  rec.grad_norm = c.machine.grad_norm();
  rec.lr = lr_at(st.in->cfg.optim, st.train.step);
  if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
    const std::string what = !std::isfinite(rec.loss) ? "the loss became " + format_number(rec.loss)
                                                      : "the gradient norm became " + format_number(rec.grad_norm);
    return fail_diverged(self, what + " at step " + std::to_string(st.train.step + 1));
  }
  const float scale = clip_scale(rec.grad_norm, st.in->cfg.optim.grad_clip);
  c.machine.begin_update();
  c.update_t0 = clock_type::now();
  // One timeout for the update (on_step_timeout) instead of one per request: CAF 0.17 keeps a
  // request's timeout in the actor clock until it expires, answered or not, so a timeout on each
  // of gpt-char-small's 61 requests a step kept about 8 KiB a step alive for runtime.step-timeout
  // (600 s): some 12 MiB of growth at 0.4 s a step (heaptrack, bench/soak_bench.sh).
  arm_timeout(self, st.in->cfg.step_timeout_s);
  auto failed = std::make_shared<bool>(false);
  const uint64_t epoch = st.epoch;  // a recovery gives this step up: its replies are stale
  for (int id : st.exec.compute_nodes)
    for (size_t r = 0; r < st.exec.replicas[id].size(); ++r)
      // Local steps (train.sync=local:H) clip each replica by its own gradient norm.
      self->request(st.exec.replicas[id][r], caf::infinite, step_atom::value, c.machine.step(), rec.lr,
                    c.machine.local_steps() ? clip_scale(c.machine.replica_norm(id, static_cast<int>(r)),
                                                         st.in->cfg.optim.grad_clip)
                                            : scale)
          .then(
              [=](stepped_atom, int32_t) {
                auto& s = self->state;
                if (*failed || s.epoch != epoch || !s.train.cur ||
                    s.train.cur->machine.on_stepped() != step_machine::verdict::complete)
                  return;
                ++s.train.step;
                maybe_snapshot(self);  // before the next step's update request: the state of this step
                const auto now = clock_type::now();
                s.train.last_stepped = now;
                s.train.cur->rec.step_s = seconds_between(s.train.cur->t0, now);
                s.train.cur->rec.update_s = seconds_between(s.train.cur->update_t0, now);
                s.train.cur->rec.tokens_per_s = static_cast<double>(s.in->cfg.batch * s.in->model.row_items) / s.train.cur->rec.step_s;
                step_record done = std::move(s.train.cur->rec);
                if (!s.members.nodes.empty()) return poll_traffic(self, std::move(done));
                end_step(self, std::move(done));
              },
              [=](caf::error& e) {
                if (*failed || self->state.epoch != epoch) return;
                *failed = true;
                fail(self, e);
              });
}

void end_step(coord_ptr self, step_record rec) {
  auto& st = self->state;
  const auto& cfg = st.in->cfg;
  st.train.cur.reset();
  st.act = activity::idle;
  ++st.timer;
  observe_step(self, rec);
  adapt_compression(self);
  maybe_reschedule(self);
  const int64_t tokens_per_step = cfg.batch * st.in->model.row_items;
  double elapsed = seconds_between(st.train.t0, clock_type::now());
  double avg_tps = static_cast<double>((st.train.step - st.train.first_step) * tokens_per_step) / std::max(elapsed, 1e-9);
  if (st.train.metrics.is_open()) log_metrics(st, step_metrics_line(rec, st.in->model, elapsed, metrics_time()));
  if (cfg.progress && (tty(st) || st.train.step % std::max<int64_t>(1, cfg.log_every) == 0 || st.train.step == cfg.steps)) {
    double eta = static_cast<double>(cfg.steps - st.train.step) * tokens_per_step / std::max(avg_tps, 1e-9);
    char timing[64] = "";
    if (rec.predicted_step_s > 0)
      std::snprintf(timing, sizeof timing, " | step %.2f s (predicted %.2f s)", rec.step_s, rec.predicted_step_s);
    std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | lr %.2e | %.0f %s/s%s | ETA %s%s", tty(st) ? "\r\33[K" : "",
                 static_cast<long long>(st.train.step), static_cast<long long>(cfg.steps), rec.loss, rec.lr, avg_tps,
                 st.in->model.is_text() ? "tok" : "img", timing,
                 format_duration(eta).c_str(), tty(st) ? "" : "\n");
  }
  st.train.last = rec;
  if (cfg.on_step) cfg.on_step(rec, elapsed);
  add_step_record(st.in->result, std::move(rec));
  auto next = [=] {
    auto& s = self->state;
    if (!s.in->cfg.checkpoint_file.empty() && s.in->cfg.checkpoint_every > 0 && s.train.step % s.in->cfg.checkpoint_every == 0)
      return save_checkpoint_async(self, s.in->cfg.checkpoint_file, [=] { begin_step(self); });
    begin_step(self);
  };
  if (cfg.eval_every > 0 && st.train.step % cfg.eval_every == 0 && st.train.step < cfg.steps) {
    return begin_eval(self, [=](eval_result v) {
      record_eval(self, v);
      next();
    });
  }
  next();
}

}  // namespace

void make_parent_dirs(const std::string& file) {
  auto parent = std::filesystem::path(file).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error("cannot create directory " + parent.string() + ": " + ec.message());
}

// Fails the run because training diverged: `what` and where the last good state is. The
// message names the last checkpoint itself, so fail() must not add "(last checkpoint: ...)".
void fail_diverged(coord_ptr self, const std::string& what) {
  auto& st = self->state;
  std::string msg = what + " (learning rate too high? lower optim.lr or set optim.grad-clip); " + last_good_state(st);
  st.train.last_checkpoint.clear();
  fail(self, make_error(fusion_errc::op_failed, msg));
}

std::vector<tensor> make_batch(const coordinator_state& st, int64_t rows) {
  std::vector<tensor> out;
  for (auto& f : st.in->model.feeds) {
    shape_t s = st.in->model.nodes[f.node].shape;
    s[0] = rows;
    out.push_back(tensor::uninitialized(s, st.in->model.nodes[f.node].type));
  }
  return out;
}

std::vector<tensor*> tensor_pointers(std::vector<tensor>& ts) {
  std::vector<tensor*> out;
  for (auto& t : ts) out.push_back(&t);
  return out;
}

void feed(coord_ptr self, uint64_t s, pass_mode mode, const std::vector<tensor>& batch, int64_t per_mb,
          int64_t first, int64_t last) {
  auto& st = self->state;
  const graph& g = st.in->model;
  const int64_t rows = batch.at(0).dim(0);
  if (last < 0) last = (rows + per_mb - 1) / per_mb;
  const placement& where = st.exec.current.where;
  for (int64_t mb = first; mb < last; ++mb)
    for (size_t k = 0; k < batch.size(); ++k)
      // The input replica on micro-batch mb's route (replica 0 without replicas).
      self->send(st.exec.replicas[g.feeds[k].node][where.replica_of(g.feeds[k].node, static_cast<int>(mb))],
                 forward_atom::value, s, static_cast<uint32_t>(mb), uint32_t{0},
                 static_cast<uint8_t>(mode), slice_rows(batch[k], mb * per_mb, std::min(per_mb, rows - mb * per_mb)));
}

void begin_training(coord_ptr self) {
  auto& s = self->state;
  s.train.training_job = true;
  enter(self, run_phase::training);
  s.in->result = train_result{};
  s.train.t0 = clock_type::now();
  s.train.first_step = s.train.step;
  write_run_record(self);
  prepare_snapshots(self);
  begin_step(self);
}

void begin_step(coord_ptr self) {
  auto& st = self->state;
  // A recovery in flight starts the step loop again once the survivors are ready.
  if (st.phase == run_phase::failed || !st.train.training_job || st.recovery.ctx) return;
  if (st.train.stop_requested) {
    refuse_boundary_tasks(self, make_error(fusion_errc::interrupted, "the run was stopped first"));
    return finish_training(self, true);
  }
  if (!st.rebalance.at_boundary.empty()) return run_boundary_tasks(self, [=] { begin_step(self); });
  if (st.train.rewire_requested) {
    st.train.rewire_requested = false;
    auto rps = std::move(st.pending.rewire_rps);
    st.pending.rewire_rps.clear();
    return apply_rewire(self, [=]() mutable {
      for (auto& rp : rps) rp.deliver(true);
      begin_step(self);
    });
  }
  if (st.train.pause_requested) {
    st.train.pause_requested = false;
    enter(self, run_phase::paused);
    if (st.in->cfg.progress)
      std::fprintf(stderr, "%sfusion-train: paused after step %lld\n", tty(st) ? "\r\33[K" : "",
                   static_cast<long long>(st.train.step));
    if (st.pending.pause_rp.pending()) st.pending.pause_rp.deliver(status_json(self));
    return;  // resume sends resume_atom(true), which comes back here
  }
  if (st.phase == run_phase::paused) return;
  if (st.train.step >= st.in->cfg.steps) return finish_training(self, false);
  const auto& cfg = st.in->cfg;
  const int64_t B = cfg.batch, M = cfg.micro_batches;
  st.train.cur.emplace();
  auto& c = *st.train.cur;
  c.machine.set_local_steps(cfg.optim.sync_every > 0);
  std::vector<int> replicas;
  for (auto& r : st.exec.replicas) replicas.push_back(static_cast<int>(r.size()));
  c.machine.begin(static_cast<uint64_t>(st.train.step), static_cast<size_t>(M), st.exec.compute_nodes,
                  st.in->model.nodes.size(), std::move(replicas));
  // The feed interval below is the one this prediction simulated.
  const step_estimate predicted = predict_step(self);
  c.rec.predicted_step_s = predicted.step_s;
  c.t0 = clock_type::now();
  c.batch = make_batch(st, B);
  try {
    st.in->data->train_batch(cfg.seed, c.machine.step(), tensor_pointers(c.batch));
  } catch (const std::exception& e) {
    return fail(self, make_error(fusion_errc::bad_config, e.what()));
  }
  st.act = activity::step;
  arm_timeout(self, cfg.step_timeout_s);
  // Paced feeding (workload_estimator::feed_interval_s): micro-batch m leaves at m x the
  // slowest node's forward time, so every node runs one micro-batch through its ops before the
  // next and the stages overlap like a pipeline. Losses do not depend on it: every op actor
  // still sees the micro-batches in order.
  const double interval = predicted.feed_interval_s;
  if (st.train.step > st.train.first_step) c.rec.boundary_s = seconds_between(st.train.last_stepped, clock_type::now());
  if (interval <= 0 || M == 1) return feed(self, c.machine.step(), pass_mode::train, c.batch, st.exec.micro_rows);
  feed(self, c.machine.step(), pass_mode::train, c.batch, st.exec.micro_rows, 0, 1);
  for (int64_t mb = 1; mb < M; ++mb)
    self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(interval * 1e6 * static_cast<double>(mb))),
                       feed_atom::value, c.machine.step(), static_cast<uint32_t>(mb));
}

void on_feed(coord_ptr self, uint64_t s, uint32_t mb) {
  auto& st = self->state;
  // The step failed or was abandoned, or (a feed can never trail its own loss) the update began.
  if (st.act != activity::step || !st.train.cur || st.train.cur->machine.step() != s ||
      st.train.cur->machine.current() != step_machine::stage::forward_backward)
    return;
  feed(self, s, pass_mode::train, st.train.cur->batch, st.exec.micro_rows, mb, mb + 1);
}

void on_loss(coord_ptr self, uint64_t s, uint32_t mb, double loss, const std::vector<double>& metrics) {
  auto& st = self->state;
  if (st.act == activity::eval) {
    if (mb >= st.train.pass.losses.size()) return;
    st.train.pass.losses[mb] = loss;
    if (st.train.pass.metrics.size() < metrics.size()) st.train.pass.metrics.resize(metrics.size(), 0.0);
    for (size_t i = 0; i < metrics.size(); ++i) st.train.pass.metrics[i] += metrics[i];
    if (++st.train.pass.got == st.train.pass.losses.size()) end_eval_batch(self);
    return;
  }
  if (st.act != activity::step || !st.train.cur) return;
  if (st.train.cur->machine.on_loss(s, mb, loss) == step_machine::verdict::complete) optimizer_step(self);
}

void on_grads(coord_ptr self, uint64_t s, int32_t id, int32_t replica, double sq, std::vector<double>& fwd,
              std::vector<double>& bwd, int32_t peak_live, const reduce_timing& ring) {
  auto& st = self->state;
  if (st.act != activity::step || !st.train.cur) return;
  auto& c = *st.train.cur;
  const auto verdict = c.machine.on_grads(s, id, replica, sq);
  if (verdict == step_machine::verdict::refused) return;
  // Every micro-batch is timed by the one replica on its route (the others report zero for it),
  // so the op's record is the sum of its replicas' arrays.
  auto same = std::find_if(c.rec.ops.begin(), c.rec.ops.end(), [id](auto& o) { return o.node == id; });
  if (same == c.rec.ops.end()) {
    op_measurement m;
    m.node = id;
    m.forward_s = std::move(fwd);
    m.backward_s = std::move(bwd);
    m.peak_live = peak_live;
    c.rec.ops.push_back(std::move(m));
    same = std::prev(c.rec.ops.end());
  } else {
    same->peak_live = std::max(same->peak_live, static_cast<int>(peak_live));
    for (size_t m = 0; m < same->forward_s.size() && m < fwd.size(); ++m) same->forward_s[m] += fwd[m];
    for (size_t m = 0; m < same->backward_s.size() && m < bwd.size(); ++m) same->backward_s[m] += bwd[m];
  }
  // The report left as the replica's all-reduce ended, ring_s after its backward did: both on
  // this clock, less the same one-way latency (different nodes' clocks are never compared).
  const double arrived = seconds_between(c.t0, clock_type::now());
  c.last_backward_s = std::max(c.last_backward_s, arrived - ring.ring_s);
  const int replicas = st.exec.current.where.replicas(id);
  if (replicas > 1 && ring.bytes_sent > 0 && replica >= 0 && replica < replicas) {
    c.last_ring_s = std::max(c.last_ring_s, arrived);
    same->reduce_s.resize(static_cast<size_t>(replicas), 0.0);
    same->reduce_work_s.resize(static_cast<size_t>(replicas), 0.0);
    same->reduce_s[replica] = ring.ring_s;
    same->reduce_work_s[replica] = ring.work_s;
    same->reduce_bytes += ring.bytes_sent;
    c.rec.allreduce_bytes += ring.bytes_sent;
    c.rec.allreduce_work_s += ring.work_s;
  }
  if (verdict == step_machine::verdict::complete) {
    if (c.last_ring_s >= 0) c.rec.allreduce_exposed_s = std::max(0.0, c.last_ring_s - c.last_backward_s);
    optimizer_step(self);
  }
}

void on_step_timeout(coord_ptr self) {
  auto& st = self->state;
  std::string what;
  if (st.act == activity::step && st.train.cur && st.train.cur->machine.current() == step_machine::stage::update) {
    what = "the optimizer update of step " + std::to_string(st.train.step + 1) + " on every op actor (" +
           std::to_string(st.train.cur->machine.updates_left()) + " not answered)";
  } else if (st.act == activity::step && st.train.cur) {
    // What is missing points at the stuck edge or node.
    const auto& m = st.train.cur->machine;
    what = "forward/backward of step " + std::to_string(st.train.step + 1) + " (losses " + std::to_string(m.losses_in()) +
           "/" + std::to_string(m.micro_batches()) + "; no gradients yet from";
    int listed = 0;
    for (int id : m.waiting_for_grads())
      if (listed++ < 8) what += " " + st.in->model.nodes[id].name;
    what += listed > 8 ? " ...)" : ")";
  } else if (st.act == activity::polling) {
    what = "the nodes' traffic counters after step " + std::to_string(st.train.step);
  } else if (st.act == activity::eval) {
    what = "evaluation";
  } else if (st.act == activity::sample) {
    what = "sampling logits";
  } else {
    return;
  }
  fail(self, make_error(fusion_errc::timeout, "timed out after " + format_seconds(st.in->cfg.step_timeout_s) +
                                                  " waiting for " + what +
                                                  " (runtime.step-timeout)"));
}

void finish_training(coord_ptr self, bool interrupted) {
  auto& st = self->state;
  st.train.training_job = false;
  enter(self, run_phase::ready);
  st.in->result.interrupted = interrupted;
  if (tty(st)) std::fputc('\n', stderr);
  auto complete = [=] {
    auto& s = self->state;
    auto& r = s.in->result;
    r.seconds = seconds_between(s.train.t0, clock_type::now());
    r.tokens_per_s = r.seconds > 0 ? static_cast<double>((s.train.step - s.train.first_step) * s.in->cfg.batch *
                                                         s.in->model.row_items) / r.seconds
                                   : 0;
    if (s.pending.train_rp.pending()) s.pending.train_rp.deliver(true);
  };
  auto checkpoint = [=] {
    auto& s = self->state;
    if (s.in->cfg.checkpoint_file.empty()) return complete();
    save_checkpoint_async(self, s.in->cfg.checkpoint_file, complete);
  };
  if (st.in->cfg.eval_batches > 0 && !interrupted) {
    return begin_eval(self, [=](eval_result v) {
      // The session checked that the split holds a batch, so NaN is a diverged model, not "none
      // ran": a run without a checkpoint would otherwise end "done" with a broken model.
      if (!std::isfinite(v.loss))
        return fail_diverged(self, "the validation loss became " + format_number(v.loss) + " after step " +
                                       std::to_string(self->state.train.step));
      record_eval(self, v);
      checkpoint();
    });
  }
  checkpoint();
}

void write_run_record(coord_ptr self) {
  auto& st = self->state;
  const auto& c = st.in->cfg;
  if (c.metrics_file.empty() || st.train.run_record_written) return;
  try {
    make_parent_dirs(c.metrics_file);
  } catch (const std::exception&) {
  }
  st.train.metrics.open(c.metrics_file, std::ios::app);
  if (!st.train.metrics)
    return fail(self, make_error(fusion_errc::bad_config, "cannot open the metrics file " + c.metrics_file +
                                                              " (output.metrics)"));
  st.train.run_record_written = true;
  const auto& o = c.optim;
  json cfg = {{"model.file", c.model_file}, {"data.file", c.data_file}, {"data.vocab", c.vocab_file},
              {"data.val-fraction", c.val_fraction}, {"train.batch", c.batch},
              {"train.micro-batches", c.micro_batches}, {"train.schedule", c.schedule},
              {"train.steps", c.steps}, {"train.seed", c.seed},
              {"train.eval-every", c.eval_every}, {"train.eval-batches", c.eval_batches},
              {"train.resume", c.resume_from}, {"optim.kind", o.kind}, {"optim.lr", o.lr}, {"optim.min-lr", o.min_lr},
              {"optim.warmup-steps", o.warmup_steps}, {"optim.total-steps", o.total_steps},
              {"optim.beta1", o.beta1}, {"optim.beta2", o.beta2}, {"optim.eps", o.eps},
              {"optim.weight-decay", o.weight_decay}, {"optim.momentum", o.momentum},
              {"optim.grad-clip", o.grad_clip},
              {"train.sync", sync_name(o.sync_every)}, {"train.outer-lr", o.outer_lr},
              {"train.outer-momentum", o.outer_momentum}, {"output.checkpoint", c.checkpoint_file},
              {"output.checkpoint-every", c.checkpoint_every},
              {"output.keep-checkpoints", c.keep_checkpoints}, {"runtime.threads", c.threads},
              {"runtime.blas-threads", c.blas_threads}, {"runtime.device", c.device},
              {"runtime.precision", c.precision},
              {"runtime.cpu-ops", c.cpu_ops}, {"runtime.step-timeout", c.step_timeout_s},
              {"runtime.scheduler", c.scheduler}, {"cluster.file", c.cluster_file},
              {"recovery.mode", c.recovery_mode.empty() ? (c.checkpoint_file.empty() ? "off" : "auto") : c.recovery_mode},
              {"recovery.snapshot-every", c.snapshot_every},
              {"flow.transport", c.transport}, {"flow.window", c.flow.window}, {"flow.chunk-kib", c.flow.chunk_bytes >> 10},
              {"scheduler.enabled", c.rebalance.enabled}, {"scheduler.every", c.rebalance.every},
              {"scheduler.min-gain", c.rebalance.min_gain}, {"scheduler.horizon", c.rebalance.horizon},
              {"scheduler.confirmations", c.rebalance.confirmations}, {"scheduler.first", c.rebalance.first}};
  json rec = {{"type", "run"}, {"time", metrics_time()}, {"model", st.in->model.name},
              {"items", st.in->model.is_text() ? "tokens" : "images"},
              {"parameters", st.in->model.param_count()}, {"operators", st.in->model.nodes.size()},
              {"first_step", st.train.step}, {"config", cfg}};
  log_metrics(st, rec.dump());
}

}  // namespace fusion
