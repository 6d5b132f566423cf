// fusion-train: trains an OP-DAG model with one CAF actor per operator.
//
//   fusion-train --config configs/runs/char-tiny.ini [--model FILE] [--train.steps=200] ...
//   fusion-train --config configs/runs/char-tiny.ini --sample 300 [--prompt "In the beginning"]
//
// Settings come from the INI file named by --config and are overridden on the command line
// (--category.key=value). CAF's INI parser silently drops unknown keys and values of the wrong
// type, so the file is linted against the option table first and every problem is reported.
#include <caf/all.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <variant>

#include "actors/trainer.hpp"
#include "apps/app_options.hpp"

namespace {

using namespace fusion;

// Set by SIGINT/SIGTERM: the run finishes the step in flight and checkpoints before exiting.
std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) { stop_requested.store(true); }

struct sample_options {
  int64_t count = 0;
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t after_training = 200;
};

struct train_app_config : table_config {
  train_config run;
  sample_options sample;
  uint64_t threads = 0, blas_threads = 1;
  double step_timeout_s = 600;
  bool quiet = false;
  uint64_t window = 0, chunk_kib = 0;

  train_app_config() {
    auto& o = run.optim;
    window = run.window;
    chunk_kib = run.chunk_bytes >> 10;
    add_rows({
        {"model", "file", "OP-DAG model file (.pbtxt); --model FILE for short", &run.model_file},
        {"data", "file", "training text (default data/kjv.txt from scripts/get-data.sh)", &run.data_file},
        {"data", "vocab", "character vocabulary file: read if present, else built from the corpus and written",
         &run.vocab_file},
        {"data", "val-fraction", "fraction of the corpus tail held out for validation", &run.val_fraction},
        {"train", "batch", "global batch: sequences per optimizer step", &run.batch},
        {"train", "micro-batches", "pipeline micro-batches per step (divides batch)", &run.micro_batches},
        {"train", "steps", "total optimizer steps", &run.steps},
        {"train", "seed", "seed for parameter init and batch order", &run.seed},
        {"train", "eval-every", "validate every N steps (0: at the end only)", &run.eval_every},
        {"train", "eval-batches", "validation batches per evaluation", &run.eval_batches},
        {"train", "log-every", "progress line every N steps (when stderr is not a terminal)", &run.log_every},
        {"train", "resume", "checkpoint to resume from (or to sample from)", &run.resume_from},
        {"optim", "kind", "adamw or sgd", &o.kind},
        {"optim", "lr", "peak learning rate", &o.lr},
        {"optim", "min-lr", "cosine schedule floor", &o.min_lr},
        {"optim", "warmup-steps", "linear warm-up steps", &o.warmup_steps},
        {"optim", "total-steps", "cosine schedule length (0: train.steps)", &o.total_steps},
        {"optim", "beta1", "AdamW beta1", &o.beta1},
        {"optim", "beta2", "AdamW beta2", &o.beta2},
        {"optim", "eps", "AdamW epsilon", &o.eps},
        {"optim", "weight-decay", "weight decay (decoupled for AdamW)", &o.weight_decay},
        {"optim", "momentum", "SGD momentum", &o.momentum},
        {"optim", "grad-clip", "max global gradient norm (0: off)", &o.grad_clip},
        {"output", "metrics", "JSON-lines metrics file", &run.metrics_file},
        {"output", "checkpoint", "checkpoint file (written at the end and every checkpoint-every steps)",
         &run.checkpoint_file},
        {"output", "checkpoint-every", "checkpoint interval in steps (0: at the end only)", &run.checkpoint_every},
        {"output", "sample-chars", "characters generated after training (0: none)", &sample.after_training},
        {"sample", "count", "generate N characters from the checkpoint and exit; --sample N for short",
         &sample.count},
        {"sample", "prompt", "text the generation starts from", &sample.prompt},
        {"sample", "temperature", "sampling temperature (0: greedy)", &sample.temperature},
        {"runtime", "threads", "actor scheduler threads (0: one per core)", &threads},
        {"runtime", "blas-threads", "OpenBLAS threads per op call", &blas_threads},
        {"runtime", "device", "where the op actors compute in a one-process run: cpu, cuda or cuda:N", &run.device},
        {"runtime", "cpu-ops", "comma-separated op-name globs kept on the CPU in a GPU run (e.g. \"lm_head,h1.*\")",
         &run.cpu_ops},
        {"runtime", "step-timeout", "seconds before a stuck step aborts the run", &step_timeout_s},
        {"runtime", "quiet", "no progress lines", &quiet},
        {"runtime", "scheduler", "actor scheduler: stealing or sharing (default: stealing, sharing with a cluster)",
         &run.scheduler},
        {"cluster", "file", "cluster file: run the operators on fusion-node processes (empty: all in this process)",
         &run.cluster_file},
        {"cluster", "listen", "HOST:PORT this coordinator listens on for nodes (default: the cluster file's)",
         &run.listen},
        {"cluster", "join-timeout", "seconds to wait for every node of the cluster file to join", &run.join_timeout_s},
        {"cluster", "heartbeat-ms", "heartbeat interval between processes in milliseconds", &run.heartbeat_ms},
        {"cluster", "peer-timeout-ms", "a process silent this long is declared dead (milliseconds)",
         &run.peer_timeout_ms},
        {"flow", "transport", "how tensors cross processes: tcp (data channel) or caf (CAF messages)",
         &run.transport},
        {"flow", "window", "chunks in flight per cross-process edge", &window},
        {"flow", "chunk-kib", "largest chunk of a tensor on a cross-process edge, KiB", &chunk_kib},
    });
    o.total_steps = 0;
  }
};

const char* usage =
    "usage: fusion-train --config FILE.ini [--model FILE] [--steps N] [--resume CKPT] [--cluster FILE]\n"
    "                    [--sample N [--prompt TEXT]] [--category.key=value ...]\n\n"
    "Trains an OP-DAG model, one CAF actor per operator, on a text corpus: in this process, or on the\n"
    "fusion-node processes of a cluster file (--cluster). Settings are [category] key=value lines of\n"
    "the INI file; the command line overrides any of them as --category.key=value (e.g.\n"
    "--train.steps=50 --optim.lr=3.0e-4). INI reals need a decimal point and strings double quotes;\n"
    "the file is checked and every problem is reported. See docs/training.md and docs/cluster.md.\n";

int run(int argc, char** argv) {
  train_app_config cfg;
  static const std::vector<option_alias> aliases = {{"--model", "model.file", true},
                                                    {"--sample", "sample.count", false},
                                                    {"--prompt", "sample.prompt", true},
                                                    {"--resume", "train.resume", true},
                                                    {"--steps", "train.steps", false},
                                                    {"--cluster", "cluster.file", true}};
  switch (load_options("fusion-train", usage, cfg, argc, argv, aliases)) {
    case load_result::exit_ok: return 0;
    case load_result::exit_usage: return 2;
    case load_result::run: break;
  }
  if (cfg.run.model_file.empty())
    throw std::runtime_error("no model file: set [model] file in the config or pass --model FILE");
  if (cfg.run.optim.total_steps == 0) cfg.run.optim.total_steps = cfg.run.steps;
  cfg.run.threads = static_cast<int>(cfg.threads);
  cfg.run.blas_threads = static_cast<int>(cfg.blas_threads);
  cfg.run.step_timeout_s = cfg.step_timeout_s;
  cfg.run.progress = !cfg.quiet;
  cfg.run.window = static_cast<uint32_t>(std::max<uint64_t>(1, cfg.window));
  cfg.run.chunk_bytes = std::max<uint64_t>(1, cfg.chunk_kib) << 10;

  if (cfg.sample.count > 0) {
    if (cfg.run.resume_from.empty()) cfg.run.resume_from = cfg.run.checkpoint_file;
    if (cfg.run.resume_from.empty())
      throw std::runtime_error("--sample needs a checkpoint: set [output] checkpoint or pass --resume FILE");
    cfg.run.metrics_file.clear();
    session s(cfg.run);
    std::cout << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.count), cfg.sample.prompt, cfg.sample.temperature, cfg.run.seed)
              << std::endl;
    return 0;
  }

  cfg.run.stop_flag = &stop_requested;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  session s(cfg.run);
  std::fprintf(stderr, "fusion-train: model %s, %lld parameters, %zu operator actors, batch %lld in %lld micro-batches\n",
               cfg.run.model_file.c_str(), static_cast<long long>(s.param_count()), s.actor_count(),
               static_cast<long long>(cfg.run.batch), static_cast<long long>(cfg.run.micro_batches));
  if (s.step() > 0) std::fprintf(stderr, "fusion-train: resumed at step %lld\n", static_cast<long long>(s.step()));
  train_result r = s.train();
  if (r.interrupted) {
    std::fprintf(stderr, "fusion-train: interrupted at step %lld%s\n", static_cast<long long>(s.step()),
                 cfg.run.checkpoint_file.empty() ? " (no checkpoint configured)"
                                                 : (", checkpoint written to " + cfg.run.checkpoint_file).c_str());
    return 130;
  }
  std::fprintf(stderr, "fusion-train: %zu steps in %.1f s, %.0f tokens/s, peak RSS %.0f MiB", r.steps.size(), r.seconds,
               r.tokens_per_s, r.peak_rss_mb);
  if (!r.val_losses.empty()) std::fprintf(stderr, ", val_loss %.4f", r.val_losses.back().second);
  std::fprintf(stderr, " (unigram entropy %.4f)\n", s.unigram_entropy());
  if (cfg.sample.after_training > 0)
    std::cout << "--- sample ---\n"
              << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.after_training), cfg.sample.prompt, cfg.sample.temperature,
                          cfg.run.seed)
              << "\n--------------" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fusion-train: error: " << e.what() << "\n";
    return 1;
  }
}
