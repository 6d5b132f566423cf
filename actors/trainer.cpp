#include "actors/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include <caf/io/all.hpp>

#include "actors/edge_actor.hpp"
#include "actors/messages.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_actor.hpp"
#include "actors/op_device.hpp"
#include "actors/session_impl.hpp"
#include "core/cluster.hpp"
#include "core/wire.hpp"
#include "scheduler/placement.hpp"
#include "core/checkpoint.hpp"
#include "core/data.hpp"
#include "core/graph.hpp"
#include "ops/cpu/blas.hpp"

namespace fusion {

namespace {

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
  return buf;
}

void make_parent_dirs(const std::string& file) {
  auto parent = std::filesystem::path(file).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error("cannot create directory " + parent.string() + ": " + ec.message());
}

}  // namespace

double peak_rss_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// {"step": N, "ops": {"h0.fc": {"fwd_ms": [..], "bwd_ms": [..]}, ...}, "edges": [...]}: the
// measurements of one step, per micro-batch for ops and per edge for cross-process traffic.
std::string measurement_json(const step_record& rec, const graph& g) {
  std::string out = "{\"step\": " + std::to_string(rec.step) + ", \"ops\": {";
  char buf[64];
  auto list = [&](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.3f", i ? ", " : "", v[i] * 1e3);
      s += buf;
    }
    return s + "]";
  };
  for (size_t i = 0; i < rec.ops.size(); ++i) {
    auto& m = rec.ops[i];
    out += (i ? ", \"" : "\"") + g.nodes[m.node].name + "\": {\"fwd_ms\": " + list(m.forward_s) +
           ", \"bwd_ms\": " + list(m.backward_s) + "}";
  }
  out += "}, \"edges\": [";
  for (size_t i = 0; i < rec.edges.size(); ++i) {
    auto& e = rec.edges[i];
    std::snprintf(buf, sizeof buf, "%.6f", e.seconds);
    out += std::string(i ? ", " : "") + "{\"from\": \"" + e.from_node + "\", \"to\": \"" + e.to_node +
           "\", \"edge\": \"" + g.nodes[e.producer].name + "->" + g.nodes[e.consumer].name + "\", \"dir\": \"" +
           (e.forward ? "fwd" : "bwd") + "\", \"bytes\": " + std::to_string(e.bytes) +
           ", \"tensors\": " + std::to_string(e.tensors) + ", \"seconds\": " + buf + "}";
  }
  return out + "]}";
}


session::impl::impl(train_config c) : cfg(std::move(c)) {
  if (cfg.batch < 1) throw std::runtime_error("train.batch must be >= 1, got " + std::to_string(cfg.batch));
  if (cfg.micro_batches < 1 || cfg.batch % cfg.micro_batches != 0)
    throw std::runtime_error("train.micro-batches (" + std::to_string(cfg.micro_batches) +
                             ") must be >= 1 and divide train.batch (" + std::to_string(cfg.batch) + ")");
  check_optim_config(cfg.optim);
  check_devices();
  micro_rows = cfg.batch / cfg.micro_batches;
  model = load_graph(cfg.model_file, micro_rows);

  std::string text = read_text_file(cfg.data_file);
  if (!cfg.vocab_file.empty() && std::filesystem::exists(cfg.vocab_file)) {
    tokenizer.load(cfg.vocab_file);
  } else {
    tokenizer.build(text);
    if (!cfg.vocab_file.empty()) {
      make_parent_dirs(cfg.vocab_file);
      tokenizer.save(cfg.vocab_file);
    }
  }
  if (tokenizer.size() > model.vocab)
    throw std::runtime_error("corpus " + cfg.data_file + " has " + std::to_string(tokenizer.size()) +
                             " distinct characters but model " + cfg.model_file + " has vocabulary " +
                             std::to_string(model.vocab));
  data = std::make_unique<text_dataset>(tokenizer.encode(text), cfg.val_fraction);

  cpu::set_blas_threads(std::max(1, cfg.blas_threads));
  int threads = cfg.threads > 0 ? cfg.threads : static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  sys_cfg.set("scheduler.max-threads", static_cast<int64_t>(threads));
  set_scheduler_policy(sys_cfg, cfg.scheduler.empty() ? (cfg.cluster_file.empty() ? "stealing" : "sharing")
                                                      : cfg.scheduler);
  add_fusion_message_types(sys_cfg);
  if (!cfg.cluster_file.empty()) {
    cluster = load_cluster(cfg.cluster_file);
    place = place_ops(model, cluster);
    set_liveness(sys_cfg, cfg.heartbeat_ms, cfg.peer_timeout_ms);
    if (cfg.transport != "tcp" && cfg.transport != "caf")
      throw std::runtime_error("flow.transport must be \"tcp\" or \"caf\", got \"" + cfg.transport + "\"");
    sys_cfg.load<caf::io::middleman>();
  }
  sys = std::make_unique<caf::actor_system>(sys_cfg);
  self = std::make_unique<caf::scoped_actor>(*sys);

  actor_run_params run{static_cast<uint32_t>(cfg.micro_batches), cfg.seed, cfg.optim};
  for (auto& n : model.nodes)
    if (!n.is_input()) compute_nodes.push_back(n.id);
  if (cfg.cluster_file.empty()) {
    const auto cpu_ops = split_patterns(cfg.cpu_ops);
    for (auto& n : model.nodes) {
      run.device = device_for_op(normalize_device(cfg.device), cpu_ops, n.name);
      actors.list.push_back(spawn_op_actor(*sys, make_node_spec(model, n.id), run));
    }
    // The acknowledgements are collected so none is left in the mailbox for a later gather.
    gather<bool>(model.nodes.size(), "connecting the op actors", [&] {
      for (auto& n : model.nodes) {
        std::vector<caf::actor> consumers, producers;
        for (auto& c : n.consumers) consumers.push_back(actors[c.node]);
        for (int p : n.inputs) producers.push_back(actors[p]);
        (*self)->send(actors[n.id], connect_atom::value, std::move(consumers), std::move(producers),
                      caf::actor_cast<caf::actor>(*self));
      }
    });
  } else {
    join_nodes();
    spawn_on_nodes(run);
  }
  if (!cfg.resume_from.empty()) load(cfg.resume_from);
  if (!cfg.metrics_file.empty()) {
    make_parent_dirs(cfg.metrics_file);
    metrics.open(cfg.metrics_file, std::ios::app);
    if (!metrics) throw std::runtime_error("cannot open metrics file " + cfg.metrics_file);
  }
}

// Fails fast, before any data is read, when runtime.device names a GPU this process cannot
// use; a cluster run takes its devices from the cluster file.
void session::impl::check_devices() {
  if (!cfg.cluster_file.empty()) {
    if (cfg.device != "cpu")
      throw std::runtime_error("runtime.device=" + cfg.device + " applies to a one-process run; with a cluster "
                               "file each node's device is its `device` entry there");
    return;
  }
  if (auto why = device_problem(cfg.device); !why.empty()) throw std::runtime_error("runtime.device: " + why);
}

// Splits a (rows, T) batch into micro-batches and sends tokens and targets to the inputs.
void session::impl::feed(uint64_t s, uint32_t first_mb, pass_mode mode, const std::vector<int32_t>& x,
                          const std::vector<int32_t>& y, int64_t rows, int64_t per_mb, int64_t T) {
  for (int64_t r = 0, mb = first_mb; r < rows; r += per_mb, ++mb) {
    auto xs = std::span<const int32_t>(x).subspan(r * T, per_mb * T);
    (*self)->send(actors[model.tokens_node], forward_atom::value, s, static_cast<uint32_t>(mb), uint32_t{0},
                  static_cast<uint8_t>(mode), tensor::from_i32({per_mb, T}, xs));
    if (mode == pass_mode::infer) continue;
    auto ys = std::span<const int32_t>(y).subspan(r * T, per_mb * T);
    (*self)->send(actors[model.targets_node], forward_atom::value, s, static_cast<uint32_t>(mb), uint32_t{0},
                  static_cast<uint8_t>(mode), tensor::from_i32({per_mb, T}, ys));
  }
}

step_record session::impl::train_step() {
  const int64_t T = model.context, B = cfg.batch, M = cfg.micro_batches;
  auto t0 = clock_type::now();
  std::vector<int32_t> x(B * T), y(B * T);
  data->train_batch(cfg.seed, static_cast<uint64_t>(step), B, T, x.data(), y.data());
  const uint64_t s = static_cast<uint64_t>(step);
  feed(s, 0, pass_mode::train, x, y, B, micro_rows, T);

  std::vector<double> losses(M, NAN), sq(model.nodes.size(), 0.0);
  size_t n_loss = 0, n_grads = 0;
  step_record rec;
  std::vector<char> reported(model.nodes.size(), 0);
  // On a timeout the message says what is missing, which points at the stuck edge or node.
  auto missing = [&] {
    std::string out = "forward/backward of step " + std::to_string(step + 1) + " (losses " +
                      std::to_string(n_loss) + "/" + std::to_string(M) + "; no gradients yet from";
    int listed = 0;
    for (int id : compute_nodes)
      if (!reported[id] && listed++ < 8) out += " " + model.nodes[id].name;
    return out + (listed > 8 ? " ...)" : ")");
  };
  wait_until([&] { return n_loss == static_cast<size_t>(M) && n_grads == compute_nodes.size(); },
             missing,
             [&](loss_atom, uint64_t, uint32_t mb, double l) { losses.at(mb) = l, ++n_loss; },
             [&](grads_atom, uint64_t, int32_t id, double v, std::vector<double>& fwd, std::vector<double>& bwd) {
               sq.at(id) = v, ++n_grads, reported.at(id) = 1;
               rec.ops.push_back({id, std::move(fwd), std::move(bwd)});
             });
  double loss = 0, norm2 = 0;
  for (double l : losses) loss += l;  // micro-batch order: deterministic
  for (double v : sq) norm2 += v;     // node order: deterministic
  std::sort(rec.ops.begin(), rec.ops.end(), [](auto& a, auto& b) { return a.node < b.node; });
  rec.step = step + 1;
  rec.loss = loss / static_cast<double>(M);
  rec.grad_norm = std::sqrt(norm2);
  rec.lr = lr_at(cfg.optim, step);
  if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm))
    throw std::runtime_error("loss became " + std::to_string(rec.loss) + " at step " + std::to_string(step + 1) +
                             " (learning rate too high?); the last checkpoint is unaffected");
  float scale = clip_scale(rec.grad_norm, cfg.optim.grad_clip);
  for (int id : compute_nodes) (*self)->send(actors[id], step_atom::value, s, rec.lr, scale);
  size_t n_stepped = 0;
  wait_until([&] { return n_stepped == compute_nodes.size(); }, "optimizer step",
             [&](stepped_atom, int32_t) { ++n_stepped; });
  ++step;
  rec.tokens_per_s = static_cast<double>(B * T) / seconds_between(t0, clock_type::now());
  if (!nodes.list.empty()) rec.edges = poll_edge_traffic();
  return rec;
}

double session::impl::evaluate() {
  const int64_t T = model.context, B = cfg.batch, M = cfg.micro_batches;
  int64_t n = std::min(cfg.eval_batches, data->val_batches(B, T));
  if (n <= 0) return NAN;
  double total = 0;
  std::vector<int32_t> x(B * T), y(B * T);
  for (int64_t i = 0; i < n; ++i) {
    data->val_batch(i, B, T, x.data(), y.data());
    feed(static_cast<uint64_t>(step), 0, pass_mode::eval, x, y, B, micro_rows, T);
    std::vector<double> losses(M, NAN);
    size_t got = 0;
    wait_until([&] { return got == static_cast<size_t>(M); }, "evaluation",
               [&](loss_atom, uint64_t, uint32_t mb, double l) { losses.at(mb) = l, ++got; });
    for (double l : losses) total += l;
  }
  return total / static_cast<double>(n * M);
}

std::string session::impl::sample(int count, const std::string& prompt, double temperature, uint64_t seed) {
  std::vector<int32_t> ctx = tokenizer.encode(prompt.empty() ? std::string("\n") : prompt);
  std::mt19937_64 rng(seed);
  std::string out;
  const int64_t T = model.context, V = model.vocab;
  for (int i = 0; i < count; ++i) {
    int64_t t = std::min<int64_t>(T, static_cast<int64_t>(ctx.size()));
    std::vector<int32_t> window(ctx.end() - t, ctx.end());
    feed(static_cast<uint64_t>(step), 0, pass_mode::infer, window, {}, 1, 1, t);
    tensor logits;
    wait_until([&] { return !logits.empty(); }, "sampling logits",
               [&](output_atom, uint64_t, uint32_t, tensor& v) { logits = std::move(v); });
    const float* row = logits.f32() + (t - 1) * V;
    int vocab = tokenizer.size();  // model rows beyond the corpus vocabulary are never sampled
    int next = 0;
    if (temperature <= 0) {
      next = static_cast<int>(std::max_element(row, row + vocab) - row);
    } else {
      float mx = *std::max_element(row, row + vocab);
      std::vector<double> p(vocab);
      for (int k = 0; k < vocab; ++k) p[k] = std::exp((row[k] - mx) / temperature);
      next = std::discrete_distribution<int>(p.begin(), p.end())(rng);
    }
    ctx.push_back(next);
    out += tokenizer.decode(std::span<const int32_t>(&ctx.back(), 1));
  }
  return out;
}

void session::impl::save(const std::string& path) {
  checkpoint ck;
  ck.step = static_cast<uint64_t>(step);
  ck.model_name = model.name;
  ck.meta = "model_file=" + cfg.model_file + "\nseed=" + std::to_string(cfg.seed) + "\n";
  std::vector<int32_t> vocab(tokenizer.chars().begin(), tokenizer.chars().end());
  ck.tensors.emplace_back("@vocab", tensor::from_i32({static_cast<int64_t>(vocab.size())}, vocab));
  auto parts = gather<named_tensors>(compute_nodes.size(), "collecting the parameters for a checkpoint", [&] {
    for (int id : compute_nodes) (*self)->send(actors[id], get_state_atom::value);
  });
  named_tensors all;
  for (auto& part : parts)
    for (auto& kv : part) all.push_back(std::move(kv));
  // Replies arrive in any order: sort by name so the file does not depend on timing.
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& kv : all) ck.tensors.push_back(std::move(kv));
  make_parent_dirs(path);
  fusion::save_checkpoint(path, ck);
  last_checkpoint = path + " at step " + std::to_string(step);
}

void session::impl::load(const std::string& path) {
  checkpoint ck = fusion::load_checkpoint(path);
  if (ck.model_name != model.name)
    throw std::runtime_error("checkpoint " + path + " is for model '" + ck.model_name + "', not '" + model.name + "'");
  if (const tensor* v = find_tensor(ck, "@vocab")) {
    std::vector<int32_t> mine(tokenizer.chars().begin(), tokenizer.chars().end());
    if (v->numel() != static_cast<int64_t>(mine.size()) || !std::equal(mine.begin(), mine.end(), v->i32()))
      throw std::runtime_error("checkpoint " + path + " was trained on a corpus with another vocabulary than " +
                               cfg.data_file);
  }
  named_tensors all(std::make_move_iterator(ck.tensors.begin()), std::make_move_iterator(ck.tensors.end()));
  gather<bool>(compute_nodes.size(), ("loading checkpoint " + path).c_str(), [&] {
    for (int id : compute_nodes) {
      const std::string prefix = model.nodes[id].name + "/";
      named_tensors mine;
      for (auto& kv : all)
        if (kv.first.rfind(prefix, 0) == 0 && kv.first.find('/', prefix.size()) == std::string::npos)
          mine.push_back(kv);
      (*self)->send(actors[id], set_state_atom::value, std::move(mine));
    }
  });
  step = static_cast<int64_t>(ck.step);
}

void session::impl::log_metrics(const std::string& json) {
  if (metrics.is_open()) metrics << json << '\n' << std::flush;
}


session::session(train_config cfg) : impl_(std::make_unique<impl>(std::move(cfg))) {}
session::~session() = default;

train_result session::train() {
  auto& d = *impl_;
  train_result res;
  const bool tty = d.cfg.progress && isatty(STDERR_FILENO);
  const int64_t first = d.step, tokens_per_step = d.cfg.batch * d.model.context;
  auto t0 = clock_type::now();
  auto validate = [&] {
    double v = d.evaluate();
    if (std::isnan(v)) return;
    res.val_losses.emplace_back(d.step, v);
    char buf[96];
    std::snprintf(buf, sizeof buf, "{\"step\": %lld, \"val_loss\": %.6f}", static_cast<long long>(d.step), v);
    d.log_metrics(buf);
    if (d.cfg.progress) std::fprintf(stderr, "%sstep %lld | val_loss %.4f\n", tty ? "\r\33[K" : "",
                                     static_cast<long long>(d.step), v);
  };
  while (d.step < d.cfg.steps) {
    if (d.cfg.stop_flag && d.cfg.stop_flag->load()) {
      res.interrupted = true;
      break;
    }
    step_record rec = d.train_step();
    res.steps.push_back(rec);
    double elapsed = seconds_between(t0, clock_type::now());
    double avg_tps = static_cast<double>((d.step - first) * tokens_per_step) / elapsed;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"tokens_per_s\": %.1f, "
                  "\"elapsed_s\": %.3f}",
                  static_cast<long long>(rec.step), rec.loss, rec.lr, rec.grad_norm, rec.tokens_per_s, elapsed);
    d.log_metrics(buf);
    if (d.metrics.is_open()) d.log_metrics(measurement_json(rec, d.model));
    if (d.cfg.progress && (tty || d.step % std::max<int64_t>(1, d.cfg.log_every) == 0 || d.step == d.cfg.steps)) {
      double eta = static_cast<double>(d.cfg.steps - d.step) * tokens_per_step / std::max(avg_tps, 1e-9);
      std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | ETA %s%s",
                   tty ? "\r\33[K" : "", static_cast<long long>(d.step), static_cast<long long>(d.cfg.steps),
                   rec.loss, rec.lr, avg_tps, format_duration(eta).c_str(), tty ? "" : "\n");
    }
    if (d.cfg.eval_every > 0 && d.step % d.cfg.eval_every == 0 && d.step < d.cfg.steps) validate();
    if (!d.cfg.checkpoint_file.empty() && d.cfg.checkpoint_every > 0 && d.step % d.cfg.checkpoint_every == 0)
      d.save(d.cfg.checkpoint_file);
  }
  if (tty) std::fputc('\n', stderr);
  if (d.cfg.eval_batches > 0 && !res.interrupted) validate();
  if (!d.cfg.checkpoint_file.empty()) d.save(d.cfg.checkpoint_file);
  res.seconds = seconds_between(t0, clock_type::now());
  res.tokens_per_s = res.seconds > 0 ? static_cast<double>((d.step - first) * tokens_per_step) / res.seconds : 0;
  res.peak_rss_mb = peak_rss_mb();
  return res;
}

double session::evaluate() { return impl_->evaluate(); }
std::string session::sample(int n, const std::string& prompt, double temperature, uint64_t seed) {
  return impl_->sample(n, prompt, temperature, seed);
}
void session::save_checkpoint(const std::string& path) { impl_->save(path); }
void session::load_checkpoint(const std::string& path) { impl_->load(path); }
int64_t session::step() const { return impl_->step; }
std::vector<std::string> session::cluster_nodes() const {
  std::vector<std::string> out;
  for (auto& n : impl_->cluster.nodes) out.push_back(n.name);
  return out;
}
int64_t session::param_count() const { return impl_->model.param_count(); }
size_t session::actor_count() const { return impl_->actors.size(); }
double session::unigram_entropy() const {
  return fusion::unigram_entropy(impl_->data->train_tokens(), impl_->tokenizer.size());
}

}  // namespace fusion
