#include "apps/train_settings.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "actors/op_device.hpp"
#include "core/cluster.hpp"
#include "core/graph_names.hpp"
#include "core/log.hpp"
#include "ops/optim.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

train_app_config::train_app_config() {
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

}  // namespace fusion
