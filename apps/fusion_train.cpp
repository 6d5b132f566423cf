// fusion-train: trains an OP-DAG model with one CAF actor per operator.
//
//   fusion-train --config configs/runs/char-tiny.ini [--model FILE] [--train.steps=200] ...
//   fusion-train --config configs/runs/char-tiny.ini --sample 300 [--prompt "In the beginning"]
//
// Settings come from the INI file named by --config and are overridden on the command line
// (--category.key=value or --category.key value). CAF's INI parser silently drops unknown keys
// and values of the wrong type, so the file is linted against the option table first and every
// problem is reported. Relative paths in the file are relative to the file's directory.
//
// Exit status: documented in docs/training.md, section "Exit status" (the constants below).
#include <caf/all.hpp>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <variant>

#include "actors/op_device.hpp"
#include "actors/trainer.hpp"
#include "apps/app_options.hpp"
#include "apps/prometheus.hpp"
#include "apps/run_outputs.hpp"
#include "core/cluster.hpp"
#include "core/data.hpp"
#include "core/graph_names.hpp"
#include "core/log.hpp"
#include "ops/optim.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/schedule.hpp"

namespace {

using namespace fusion;

constexpr int exit_done = 0, exit_error = 1, exit_usage = 2, exit_interrupted = 130;

// The most characters one sampling request generates: one forward pass each, which Ctrl-C does
// not cut short.
constexpr int64_t max_sample_chars = 100000;

// Set by the first SIGINT/SIGTERM while graceful_stop is on (from the session's start): the
// run finishes the step in flight and checkpoints before exiting. Any other stop signal (the
// second, or one before the session starts) exits at once with status 130.
std::atomic<bool> stop_requested{false};
std::atomic<bool> graceful_stop{false};

// What main() names when memory runs out, and what to try then.
std::string doing = "reading the options";
std::string memory_hint;

extern "C" void on_stop_signal(int) {
  // Only async-signal-safe calls here: atomics, write(2), _exit(2).
  if (graceful_stop.load() && !stop_requested.exchange(true)) {
    static const char msg[] =
        "\nfusion-train: stopping (a step in flight finishes first; interrupt again to exit at once)\n";
    if (::write(2, msg, sizeof msg - 1) < 0) {
    }
    return;
  }
  static const char msg[] = "\nfusion-train: interrupted, exiting at once\n";
  if (::write(2, msg, sizeof msg - 1) < 0) {
  }
  ::_exit(exit_interrupted);
}

void install_stop_handlers() { install_stop_signal_handler(on_stop_signal); }

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
  /// [runtime] stop-grace: seconds a step may still run after the first Ctrl-C before it is
  /// abandoned (to be mapped onto the session's config by the coordinator work).
  double stop_grace_s = 10;
  bool quiet = false;
  bool force = false;  ///< [output] force: start over an earlier run's checkpoints and metrics
  uint64_t window = 0, chunk_kib = 0;
  uint64_t admin_port = 0;  ///< [admin] port, 0..65535 (train_config::admin_port)
  uint64_t metrics_port = 0;             ///< [metrics] port: Prometheus endpoint (0: off)
  std::string metrics_host = "127.0.0.1";  ///< [metrics] host
  security::security_settings security;  ///< [security] (train_config::credentials)
  /// [compression] mode, values, blocks, floors (train_config::compression, checked in
  /// check_settings).
  std::string compression_mode = "none", compression_values = "f16", allreduce = "f32";
  std::string sync = "step";  ///< [train] sync: step or local:H (train_config::optim.sync_every)
  uint64_t compression_block = 4096, compression_scale_block = quant_default_block, compression_confirm = 2;
  std::string compression_floor_activations = "int8", compression_floor_gradients = "int8";

  train_app_config() {
    auto& o = run.optim;
    auto& cmp = run.compression;
    window = run.flow.window;
    chunk_kib = run.flow.chunk_bytes >> 10;
    add_rows({
        path_option("model", "file", "OP-DAG model file (.pbtxt); --model FILE for short", &run.model_file),
        path_option("data", "file", "training text (default data/kjv.txt from scripts/get-data.sh)", &run.data_file),
        path_option("data", "vocab",
                    "character vocabulary file (default: next to the corpus, e.g. data/kjv.vocab); rebuilt "
                    "when the corpus has characters it lacks",
                    &run.vocab_file),
        {"data", "val-fraction", "fraction of the corpus tail held out for validation", &run.val_fraction},
        {"data", "kind",
         "what a text model reads: text (the characters of data.file) or tokens (the token shards of data.shards, "
         "docs/data.md)",
         &run.data_kind},
        path_option("data", "shards",
                    "data.kind=tokens: directory of token shards (*train*.bin, *val*.bin; fusion-data tokenize or "
                    "llm.c's scripts)",
                    &run.shards_dir),
        path_option("data", "tokenizer", "data.kind=tokens: directory of the BPE tokenizer (vocab.json, merges.txt)",
                    &run.tokenizer_dir),
        path_option("data", "image-dir",
                    "image models: directory of the IDX files (train-images-idx3-ubyte[.gz], ...; default Debian's "
                    "dataset-fashion-mnist)",
                    &run.image_dir),
        {"data", "crop-padding", "image models: random crops after padding by this many pixels (0: off)",
         &run.crop_padding},
        {"data", "flip", "image models: random horizontal flips", &run.flip},
        {"train", "batch", "global batch: sequences per optimizer step", &run.batch},
        {"train", "micro-batches",
         "pipeline micro-batches per step: a divisor of batch, or auto (the estimator's choice among them, printed "
         "at start)",
         &run.micro_batches, 0, false, "auto", 0},
        {"train", "schedule",
         "pipeline schedule: eager (whatever is ready runs), gpipe (every forward before any backward), 1f1b (at "
         "most stages - position micro-batches alive per stage) or auto (the estimator's choice, printed at start)",
         &run.schedule},
        {"train", "steps", "total optimizer steps", &run.steps},
        {"train", "seed", "seed for parameter init and batch order", &run.seed},
        {"train", "eval-every", "validate every N steps (0: at the end only)", &run.eval_every},
        {"train", "eval-batches", "validation batches per evaluation", &run.eval_batches},
        {"train", "log-every", "progress line every N steps (when stderr is not a terminal)", &run.log_every},
        {"train", "allreduce",
         "values of the stage replicas' gradient all-reduce: f32, or f16 (half the bytes; every replica applies "
         "the same rounded sum)",
         &allreduce},
        {"train", "sync",
         "how stage replicas stay in step: step (gradients all-reduced every step) or local:H (each replica steps "
         "alone; every H steps the replicas average their parameter change and apply an outer Nesterov step, as "
         "DiLoCo does: 1/H of the all-reduce bytes)",
         &sync},
        {"train", "outer-lr", "train.sync=local:H: the outer optimizer's learning rate", &o.outer_lr},
        {"train", "outer-momentum", "train.sync=local:H: the outer optimizer's Nesterov momentum", &o.outer_momentum},
        path_option("train", "resume", "checkpoint to resume from (or to sample from)", &run.resume_from),
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
        path_option("output", "metrics", "JSON-lines metrics file", &run.metrics_file),
        path_option("output", "checkpoint",
                    "checkpoint directory: step-numbered files and a `latest` pointer, written at the end and every "
                    "checkpoint-every steps (a name ending in .ckpt: one file, replaced each time)",
                    &run.checkpoint_file),
        {"output", "checkpoint-every", "checkpoint interval in steps (0: at the end only)", &run.checkpoint_every},
        {"output", "keep-checkpoints", "newest checkpoints kept in the checkpoint directory (0: all)",
         &run.keep_checkpoints},
        {"output", "force",
         "start over where an earlier run left checkpoints or metrics, removing them; --force for short", &force},
        {"output", "sample-chars", "characters generated after training (0: none)", &sample.after_training},
        {"sample", "count", "generate N characters from the checkpoint and exit; --sample N for short",
         &sample.count},
        {"sample", "prompt", "text the generation starts from", &sample.prompt},
        {"sample", "temperature", "sampling temperature (0: greedy)", &sample.temperature},
        {"runtime", "threads", "actor scheduler threads (0: one per core)", &threads, max_threads},
        {"runtime", "blas-threads", "OpenBLAS threads per op call", &blas_threads, max_threads},
        {"runtime", "device", "where the op actors compute in a one-process run: cpu, cuda or cuda:N", &run.device},
        {"runtime", "precision", "GEMMs of ops on a GPU: fp32, or bf16 (tensor cores; f32 weights and activations)",
         &run.precision},
        {"runtime", "cpu-ops", "comma-separated op-name globs kept on the CPU in a GPU run (e.g. \"lm_head,h1.*\")",
         &run.cpu_ops},
        {"runtime", "step-timeout", "seconds before a stuck step aborts the run", &step_timeout_s},
        {"runtime", "stop-grace", "seconds a step may still run after Ctrl-C before it is abandoned", &stop_grace_s},
        {"runtime", "quiet", "no progress lines", &quiet},
        {"runtime", "scheduler", "actor scheduler: stealing or sharing (default: stealing, sharing with a cluster)",
         &run.scheduler},
        path_option("cluster", "file",
                    "cluster file: run the operators on fusion-node processes (empty: all in this process)",
                    &run.cluster_file),
        {"cluster", "listen", "HOST:PORT this coordinator listens on for nodes (default: the cluster file's)",
         &run.listen},
        {"cluster", "policy", "placement policy overriding the cluster file's: opfence, opfence-replicas (stage "
         "replicas where they pay), even or explicit",
         &run.policy},
        path_option("cluster", "profile",
                    "profile file: used instead of measuring the nodes and links when it exists, else written "
                    "with what was measured; --profile FILE for short",
                    &run.profile_file),
        {"cluster", "join-timeout", "seconds to wait for every node of the cluster file to join", &run.join_timeout_s},
        {"cluster", "heartbeat-ms", "heartbeat interval between processes in milliseconds", &run.heartbeat_ms},
        {"cluster", "peer-timeout-ms", "a process silent this long is declared dead (milliseconds)",
         &run.peer_timeout_ms},
        {"recovery", "mode",
         "a lost node: auto (go on on the survivors, state from a surviving replica, peer-held snapshots or the last checkpoint) or off "
         "(the run fails); default auto with output.checkpoint, else off",
         &run.recovery_mode},
        {"recovery", "snapshot-every",
         "every this many steps each op streams its state to a node of another site, the source a lost node's "
         "state is recovered from before the last checkpoint (0: off)",
         &run.snapshot_every},
        {"flow", "transport", "how tensors cross processes: tcp (data channel) or caf (CAF messages)",
         &run.transport},
        {"flow", "window", "chunks in flight per cross-process edge", &window},
        {"flow", "chunk-kib", "largest chunk of a tensor on a cross-process edge, KiB", &chunk_kib},
        {"compression", "mode",
         "codec of cross-node edges: none, topk (fixed ratio), adatopk (a rung per link from measured rates), "
         "int8 or int4 (a code per element, a scale per block)",
         &compression_mode},
        {"compression", "ratio",
         "topk: fraction of each tensor's elements kept (0 < ratio <= 1; 1 keeps all, values rounded)", &cmp.ratio},
        {"compression", "values", "element type of kept values: f32, f16 or bf16", &compression_values},
        {"compression", "block", "elements per top-k block (1..65536)", &compression_block},
        {"compression", "scale-block", "int8 and int4: elements per scale (1..65536)", &compression_scale_block},
        {"compression", "error-feedback", "gradient directions carry the dropped part over (residual)",
         &cmp.error_feedback},
        {"compression", "every", "adatopk: re-evaluate the ratios every N steps", &cmp.every},
        {"compression", "floor-activations",
         "adatopk: lowest rung of a forward (activation) link: f16 (or 1), int8, int4 or a top-k ratio below 1",
         &compression_floor_activations},
        {"compression", "floor-gradients",
         "adatopk: lowest rung of a backward (gradient) link: f16 (or 1), int8, int4 or a top-k ratio below 1",
         &compression_floor_gradients},
        {"compression", "band", "adatopk: relative ratio change below which a link's ratio stays put",
         &cmp.adaptive.band},
        {"compression", "confirm", "adatopk: evaluations in a row that must agree before a ratio changes",
         &compression_confirm},
        {"scheduler", "enabled", "OP-Fence cluster runs: re-plan from measurements and migrate ops live",
         &run.rebalance.enabled},
        {"scheduler", "every", "re-plan every N steps", &run.rebalance.every},
        {"scheduler", "min-gain", "migrate when the predicted step time drops by this fraction after the cost",
         &run.rebalance.min_gain},
        {"scheduler", "horizon", "steps a migration's cost is spread over", &run.rebalance.horizon},
        {"scheduler", "confirmations", "evaluations in a row that must propose the same placement",
         &run.rebalance.confirmations},
        {"scheduler", "first",
         "the step of one early re-plan that moves without confirmations when the move repays itself "
         "before the run ends (0: none)",
         &run.rebalance.first},
        {"admin", "port", "publish the admin actor on this port for fusion-admin (0: off)", &admin_port, 65535},
        {"admin", "host", "address the admin actor listens on", &run.admin_host},
        {"metrics", "port",
         "serve the live figures in Prometheus' text format at http://HOST:PORT/metrics (0: off)", &metrics_port,
         65535},
        {"metrics", "host", "address the Prometheus endpoint listens on", &metrics_host},
    });
    add_rows(security_rows(security));
    o.total_steps = 0;
  }
};

const char* usage =
    "usage: fusion-train --config FILE.ini [--model FILE] [--steps N] [--resume CKPT] [--cluster FILE]\n"
    "                    [--profile FILE] [--sample N [--prompt TEXT]] [--category.key=value ...]\n\n"
    "Trains an OP-DAG model, one CAF actor per operator, on a text corpus: in this process, or on the\n"
    "fusion-node processes of a cluster file (--cluster). Before placing the operators there it times\n"
    "them on every node and probes the links between sites, or reads the profile of an earlier run\n"
    "(--profile FILE; written there when FILE does not exist yet). Settings are [category] key=value\n"
    "lines of the INI file; the command line overrides any of them as --category.key=value (e.g.\n"
    "--train.steps=50 --optim.lr=3.0e-4, or --train.steps 50). INI reals need a decimal point and\n"
    "strings double quotes; the file is checked and every problem is reported. Relative paths in\n"
    "the file are relative to its directory, those on the command line to the current one.\n\n"
    "Ctrl-C lets the step in flight finish and writes the checkpoint; a second Ctrl-C exits at once.\n\n"
    "examples:\n"
    "  fusion-train --config configs/runs/char-tiny.ini --train.steps=50 --optim.lr=1.0e-3\n"
    "  fusion-train --config configs/runs/char-tiny.ini --resume=latest --train.steps=400\n\n"
    "Exit status: 0 done, 1 the run failed or an input did not load, 2 a mistake in the command line or\n"
    "settings, 130 interrupted; the full list: docs/training.md, section \"Exit status\". See also\n"
    "docs/cluster.md.\n";

// Settings that are wrong whatever the model and data: reported as usage errors (exit 2)
// before anything is loaded, all of them at once (one per line). Throws usage_error.
void check_settings(const train_app_config& cfg) {
  const train_config& r = cfg.run;
  std::vector<std::string> problems;
  if (r.model_file.empty()) problems.push_back("no model file: set [model] file in the config or pass --model FILE");
  if (r.batch < 1) problems.push_back("train.batch must be at least 1, got " + std::to_string(r.batch));
  // 0 is what `auto` stands for (the option row's word).
  if (r.micro_batches != 0 && (r.micro_batches < 1 || r.batch % r.micro_batches != 0))
    problems.push_back("train.micro-batches (" + std::to_string(r.micro_batches) + ") must be at least 1 and divide "
                      "train.batch (" + std::to_string(r.batch) + "), or be auto");
  pipeline_schedule schedule;
  if (r.schedule != "auto" && !parse_schedule(r.schedule, schedule))
    problems.push_back("train.schedule must be eager, gpipe, 1f1b or auto, got \"" + r.schedule + "\"");
  if (r.steps < 0) problems.push_back("train.steps must be at least 0, got " + std::to_string(r.steps));
  if (!(r.val_fraction >= 0 && r.val_fraction < 1))
    problems.push_back("data.val-fraction must be at least 0 and below 1, got " + format_number(r.val_fraction));
  if (r.data_kind != "text" && r.data_kind != "tokens")
    problems.push_back("data.kind must be text or tokens, got \"" + r.data_kind + "\"");
  const bool tokens = r.data_kind == "tokens";
  if (tokens && r.shards_dir.empty())
    problems.push_back("data.kind=tokens needs data.shards, the directory of token shards (fusion-data tokenize)");
  if (tokens && r.tokenizer_dir.empty())
    problems.push_back("data.kind=tokens needs data.tokenizer, the directory of vocab.json and merges.txt");
  if (r.crop_padding < 0 || r.crop_padding > 64)
    problems.push_back("data.crop-padding must be between 0 (off) and 64 pixels, got " + std::to_string(r.crop_padding));
  if (r.eval_batches < 0)
    problems.push_back("train.eval-batches must be at least 0 (0: no validation), got " +
                      std::to_string(r.eval_batches));
  if (r.log_every < 1)
    problems.push_back("train.log-every must be at least 1 step, got " + std::to_string(r.log_every));
  if (r.eval_every < 0)
    problems.push_back("train.eval-every must be at least 0 (0: at the end only), got " + std::to_string(r.eval_every));
  if (r.checkpoint_every < 0)
    problems.push_back("output.checkpoint-every must be at least 0 (0: at the end only), got " +
                      std::to_string(r.checkpoint_every));
  if (cfg.sample.after_training < 0 || cfg.sample.after_training > max_sample_chars)
    problems.push_back("output.sample-chars must be 0 (none) to " + std::to_string(max_sample_chars) + ", got " +
                      std::to_string(cfg.sample.after_training));
  if (cfg.sample.count < 0 || cfg.sample.count > max_sample_chars)
    problems.push_back("sample.count must be 0 to " + std::to_string(max_sample_chars) + ", got " +
                      std::to_string(cfg.sample.count));
  if (!(cfg.sample.temperature >= 0))
    problems.push_back("sample.temperature must be at least 0 (0: greedy), got " +
                      format_number(cfg.sample.temperature));
  const bool training = cfg.sample.count == 0;  // --sample reads the checkpoint and never evaluates
  // Training would run every step and then fail at the final evaluation, with nothing saved.
  if (training && !tokens && r.val_fraction == 0 && r.eval_batches > 0)
    problems.push_back("train.eval-batches is " + std::to_string(r.eval_batches) +
                      " but data.val-fraction is 0, so there is no validation text: set train.eval-batches=0 to "
                      "train without validation, or hold out a data.val-fraction above 0 (e.g. 0.1)");
  if (r.keep_checkpoints < 0)
    problems.push_back("output.keep-checkpoints must be at least 0 (0: keep all), got " +
                      std::to_string(r.keep_checkpoints));
  if (cfg.window > flow_config::max_window)
    problems.push_back("flow.window must be at most " + std::to_string(flow_config::max_window) +
                      " chunks in flight per edge (the edges to one node share a queue of 4096), got " +
                      std::to_string(cfg.window));
  if (!(cfg.step_timeout_s > 0 && cfg.step_timeout_s <= max_wait_s))
    problems.push_back("runtime.step-timeout must be more than 0 and at most " + format_number(max_wait_s) +
                      " seconds, got " + format_number(cfg.step_timeout_s));
  if (!(cfg.stop_grace_s >= 0 && cfg.stop_grace_s <= max_wait_s))
    problems.push_back("runtime.stop-grace must be 0 to " + format_number(max_wait_s) + " seconds, got " +
                      format_number(cfg.stop_grace_s));
  try {
    check_optim_config(r.optim);
  } catch (const std::invalid_argument& e) {
    problems.push_back(e.what());
  }
  if (!r.policy.empty() && !find_placement_policy(r.policy)) {
    std::string names;
    for (auto& n : placement_policy_names()) names += (names.empty() ? "" : ", ") + n;
    problems.push_back("cluster.policy must be one of " + names + ", got \"" + r.policy + "\"" +
                       did_you_mean(r.policy, placement_policy_names()));
  }
  codec_kind mode;
  if (!parse_codec_kind(cfg.compression_mode, mode))
    problems.push_back("compression.mode must be " + codec_names() + ", got \"" + cfg.compression_mode + "\"");
  value_type values;
  if (!parse_value_type(cfg.allreduce, values) || (values != value_type::f32 && values != value_type::f16))
    problems.push_back("train.allreduce must be f32 or f16, got \"" + cfg.allreduce + "\"");
  if (int64_t every = 0; !parse_sync(cfg.sync, every))
    problems.push_back("train.sync must be step or local:H with H a whole number of steps >= 1, got \"" + cfg.sync +
                       "\"");
  if (!parse_value_type(cfg.compression_values, values))
    problems.push_back("compression.values must be " + value_type_names() + ", got \"" + cfg.compression_values +
                      "\"");
  else if (values == value_type::int8 && cfg.compression_mode == "adatopk")
    // Its ladder already has int8 rungs and sends top-k values as int8; `values` is its keep-all rung's.
    problems.push_back("compression.values = int8 is for compression.mode = topk; adatopk's keep-all rung needs f32, "
                       "f16 or bf16 (its top-k rungs send int8 values anyway)");
  const auto& c = r.compression;
  auto ratio_ok = [](double x) { return x > 0 && x <= 1; };
  if (!ratio_ok(c.ratio))
    problems.push_back("compression.ratio must be above 0 and at most 1, got " + format_number(c.ratio));
  double level = 1;
  for (const auto& [key, text] : {std::pair{"floor-activations", &cfg.compression_floor_activations},
                                  std::pair{"floor-gradients", &cfg.compression_floor_gradients}})
    if (!parse_level(*text, level))
      problems.push_back(std::string("compression.") + key +
                        " must be f16, int8, int4 or a keep ratio above 0 and at most 1, got \"" + *text + "\"");
  if (cfg.compression_block < 1 || cfg.compression_block > codec_max_block)
    problems.push_back("compression.block must be 1 to " + std::to_string(codec_max_block) + ", got " +
                      std::to_string(cfg.compression_block));
  if (cfg.compression_scale_block < 1 || cfg.compression_scale_block > codec_max_block)
    problems.push_back("compression.scale-block must be 1 to " + std::to_string(codec_max_block) + ", got " +
                      std::to_string(cfg.compression_scale_block));
  if (c.every < 1) problems.push_back("compression.every must be at least 1 step, got " + std::to_string(c.every));
  if (!(c.adaptive.band >= 0)) problems.push_back("compression.band must be at least 0, got " + format_number(c.adaptive.band));
  if (cfg.compression_confirm < 1 || cfg.compression_confirm > 1000)
    problems.push_back("compression.confirm must be 1 to 1000, got " + std::to_string(cfg.compression_confirm));
  if (auto in_range = r.rebalance.check(); !in_range) problems.push_back(in_range.error());
  if (!r.recovery_mode.empty() && r.recovery_mode != "auto" && r.recovery_mode != "off")
    problems.push_back("recovery.mode must be auto or off, got \"" + r.recovery_mode + "\"");
  if (r.snapshot_every < 0)
    problems.push_back("recovery.snapshot-every must be 0 (off) or a number of steps, got " +
                       std::to_string(r.snapshot_every));
  // A device this machine cannot give is a setting to change, as fusion-node says too (exit 2).
  // With a cluster file, each node checks its own device.
  if (r.cluster_file.empty())
    if (auto usable = device_usable(r.device); !usable) problems.push_back("runtime.device: " + usable.error());
  if (problems.empty()) return;
  std::string all = problems.front();
  for (size_t i = 1; i < problems.size(); ++i) all += "\nfusion-train: " + problems[i];
  throw usage_error(all);
}

// train.micro-batches onto train_config (after check_settings). auto measures the profile at
// the middle divisor of the batch (at most 64 micro-batches), where the efficiency model moves
// op times least far on average (scheduler/micro_batches.hpp).
void apply_micro_batches(train_app_config& cfg) {
  auto& r = cfg.run;
  r.micro_batches_auto = r.micro_batches == 0;
  if (!r.micro_batches_auto) return;
  const auto candidates = micro_batch_candidates(r.batch, 64);
  r.micro_batches = candidates.empty() ? 1 : candidates[candidates.size() / 2];
}

// [compression] strings and unsigned keys onto train_config::compression (after check_settings).
void apply_compression(train_app_config& cfg) {
  auto& c = cfg.run.compression;
  parse_codec_kind(cfg.compression_mode, c.mode);
  parse_value_type(cfg.compression_values, c.adaptive.values);
  parse_value_type(cfg.allreduce, c.allreduce);
  parse_sync(cfg.sync, cfg.run.optim.sync_every);  // the session derives compression.allreduce_every
  c.adaptive.block = static_cast<uint32_t>(cfg.compression_block);
  c.adaptive.scale_block = static_cast<uint32_t>(cfg.compression_scale_block);
  parse_level(cfg.compression_floor_activations, c.adaptive.floor_activations);
  parse_level(cfg.compression_floor_gradients, c.adaptive.floor_gradients);
  c.adaptive.confirm = static_cast<uint32_t>(cfg.compression_confirm);
}

// The vocabulary follows the corpus (core/data.hpp): without data.vocab it is the file next to
// the corpus (data/kjv.txt -> data/kjv.vocab); the session loads, creates or rebuilds it (a file
// that lacks characters of the corpus is rebuilt from it, with a note, instead of failing the run).
void settle_vocabulary(train_config& run) {
  if (run.vocab_file.empty()) run.vocab_file = default_vocab_path(run.data_file);
}

// What the run reads, for the out-of-memory message.
std::string data_words(const train_config& run) {
  return run.data_kind == "tokens" ? "the token shards of " + run.shards_dir : "the corpus " + run.data_file;
}

int run(int argc, char** argv) {
  train_app_config cfg;
  static const std::vector<option_alias> aliases = {{"--model", "model.file", true},
                                                    {"--sample", "sample.count", false},
                                                    {"--prompt", "sample.prompt", true},
                                                    {"--resume", "train.resume", true},
                                                    {"--steps", "train.steps", false},
                                                    {"--cluster", "cluster.file", true},
                                                    {"--profile", "cluster.profile", true},
                                                    {"--force", "output.force", false}};
  switch (load_options("fusion-train", usage, cfg, argc, argv, aliases)) {
    case load_result::exit_ok: return exit_done;
    case load_result::exit_usage: return exit_usage;
    case load_result::run: break;
  }
  check_settings(cfg);
  apply_micro_batches(cfg);
  apply_compression(cfg);
  if (cfg.run.optim.total_steps == 0) cfg.run.optim.total_steps = cfg.run.steps;
  cfg.run.threads = static_cast<int>(cfg.threads);
  cfg.run.blas_threads = static_cast<int>(cfg.blas_threads);
  cfg.run.step_timeout_s = cfg.step_timeout_s;
  cfg.run.stop_grace_s = cfg.stop_grace_s;
  cfg.run.progress = !cfg.quiet;
  cfg.run.flow = flow_config{static_cast<uint32_t>(std::min<uint64_t>(cfg.window, UINT32_MAX)), cfg.chunk_kib << 10}
                     .clamped();
  cfg.run.admin_port = static_cast<uint16_t>(cfg.admin_port);
  // Only a run that opens a port (nodes, admin shell) needs an identity. A one-process run whose
  // admin shell was given no certificates makes its own (loopback only).
  const bool no_security = cfg.security.mode == "tls" && cfg.security.certs.empty() && cfg.security.files.ca.empty() &&
                           cfg.security.files.certificate.empty() && cfg.security.files.key.empty();
  if (cfg.run.admin_port != 0 && cfg.run.cluster_file.empty() && no_security && cfg.sample.count == 0)
    cfg.security.certs = make_admin_certs(cfg.run);
  if (!cfg.run.cluster_file.empty() || cfg.run.admin_port != 0)
    cfg.run.credentials = load_security("fusion-train", cfg.security, security::role::coordinator);
  if (cfg.run.admin_port != 0) {
    // The exact command to attach with, printed once the port is open.
    std::string admin = (std::filesystem::path(argv[0]).parent_path() / "fusion-admin").string();
    if (!std::filesystem::exists(admin)) admin = "fusion-admin";
    cfg.run.on_admin_listening = [admin, host = cfg.run.admin_host, sec = cfg.security](uint16_t port) {
      std::fprintf(stderr, "fusion-train: attach the admin shell with: %s\n",
                   admin_command(admin, host, port, sec).c_str());
      std::fprintf(stderr, "fusion-train: or watch the run live with: %s watch\n",
                   admin_command(admin, host, port, sec).c_str());
    };
  }

  if (cfg.sample.count > 0) {
    cfg.run.resume_from = sample_checkpoint(cfg.run);
    cfg.run.metrics_file.clear();
    cfg.run.eval_batches = 0;  // sampling never evaluates: a corpus without validation text is fine
    settle_vocabulary(cfg.run);
    // The session reads the corpus first, then the model and the checkpoint.
    doing = "reading " + data_words(cfg.run) + ", then loading the model " + cfg.run.model_file +
            " and the checkpoint " + cfg.run.resume_from;
    memory_hint = "the whole corpus is held in memory";
    session s(cfg.run);
    doing = "sampling";
    std::cout << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.count), cfg.sample.prompt, cfg.sample.temperature, cfg.run.seed)
              << std::endl;
    return exit_done;
  }

  settle_run_outputs(cfg.run, cfg.force);
  settle_vocabulary(cfg.run);
  std::unique_ptr<prometheus_server> prometheus;
  if (cfg.metrics_port != 0) {
    try {
      prometheus = std::make_unique<prometheus_server>(
          cfg.metrics_host, static_cast<uint16_t>(cfg.metrics_port),
          prometheus_run_info{std::filesystem::path(cfg.run.model_file).stem().string(), "tokens", cfg.run.steps});
    } catch (const std::runtime_error& e) {
      throw usage_error(e.what());
    }
    std::fprintf(stderr, "fusion-train: Prometheus metrics at http://%s:%u/metrics\n", cfg.metrics_host.c_str(),
                 static_cast<unsigned>(prometheus->port()));
    cfg.run.on_step = [p = prometheus.get()](const step_record& rec, double elapsed_s) { p->update(rec, elapsed_s); };
  }
  cfg.run.stop_flag = &stop_requested;
  graceful_stop.store(true);
  memory_hint = "the whole corpus is held in memory; otherwise try a smaller train.batch, more "
                "train.micro-batches or a smaller model";
  doing = "reading " + data_words(cfg.run) + ", then loading the model " + cfg.run.model_file +
          " for train.batch " + std::to_string(cfg.run.batch) + " in " +
          (cfg.run.micro_batches_auto ? std::string("auto") : std::to_string(cfg.run.micro_batches)) + " micro-batches";
  session s(cfg.run);
  doing = "training (train.batch " + std::to_string(cfg.run.batch) + ", " + std::to_string(s.micro_batches()) +
          " micro-batches)";
  std::fprintf(stderr, "fusion-train: model %s, %lld parameters, %zu operator actors, batch %lld in %lld micro-batches\n",
               cfg.run.model_file.c_str(), static_cast<long long>(s.param_count()), s.actor_count(),
               static_cast<long long>(cfg.run.batch), static_cast<long long>(s.micro_batches()));
  std::fprintf(stderr, "fusion-train: data: %s\n", s.describe_data().c_str());
  if (prometheus) prometheus->set_items(s.is_text() ? "tokens" : "images");
  if (s.step() > 0) std::fprintf(stderr, "fusion-train: resumed at step %lld\n", static_cast<long long>(s.step()));
  train_result r = s.train();
  if (r.interrupted) {
    std::fprintf(stderr, "fusion-train: interrupted at step %lld\n", static_cast<long long>(s.step()));
    print_run_outputs(cfg.run);
    return exit_interrupted;
  }
  std::fprintf(stderr, "fusion-train: %lld steps in %.1f s, %.0f %s/s, peak RSS %.0f MiB",
               static_cast<long long>(r.steps_run), r.seconds, r.tokens_per_s, s.item_name().c_str(), r.peak_rss_mb);
  if (!r.val_losses.empty()) std::fprintf(stderr, ", val_loss %.4f", r.val_losses.back().second);
  // An image model evaluates on its test split, a text model on the corpus's validation tail.
  if (!r.val_accuracies.empty())
    std::fprintf(stderr, ", %s accuracy %.2f%%", s.is_text() ? "validation" : "test",
                 100 * r.val_accuracies.back().second);
  if (!r.val_bits_per_byte.empty()) std::fprintf(stderr, ", val_bpb %.4f", r.val_bits_per_byte.back().second);
  if (s.is_text() && !std::isnan(s.unigram_entropy())) std::fprintf(stderr, " (unigram entropy %.4f)", s.unigram_entropy());
  std::fputc('\n', stderr);
  doing = "sampling";
  if (cfg.sample.after_training > 0 && s.is_text())
    std::cout << "--- sample ---\n"
              << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.after_training), cfg.sample.prompt, cfg.sample.temperature,
                          cfg.run.seed)
              << "\n--------------" << std::endl;
  print_run_outputs(cfg.run);
  return exit_done;
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_handlers();
  try {
    return run(argc, argv);
  } catch (const interrupted_error& e) {
    std::cerr << "fusion-train: " << e.what() << "\n";  // "interrupted ..." and why
    return exit_interrupted;
  } catch (const usage_error& e) {
    std::cerr << "fusion-train: " << e.what() << " (see --help)\n";
    return exit_usage;
  } catch (const std::bad_alloc&) {
    std::cerr << "fusion-train: out of memory while " << doing << (memory_hint.empty() ? "" : ": " + memory_hint)
              << "\n";
    return exit_error;
  } catch (const std::exception& e) {
    std::cerr << "fusion-train: error: " << e.what() << "\n";
    return exit_error;
  }
}
