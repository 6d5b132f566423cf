// What a training run is configured with: the INI file of fusion-train and the command line map
// onto train_config (apps/app_options.cpp); the session and the coordinator read it. CAF-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/metrics_record.hpp"
#include "core/wire.hpp"
#include "ops/optim.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/rebalancer.hpp"
#include "security/identity.hpp"

namespace fusion {

/// Everything a training run is configured with (fusion-train maps its INI file onto this).
struct train_config {
  std::string model_file;                  ///< OP-DAG model (.pbtxt)
  std::string data_file = "data/kjv.txt";  ///< training text
  std::string vocab_file;                  ///< character vocabulary: loaded if it exists, else built
                                           ///< from the corpus and written there; empty: built, not saved
  double val_fraction = 0.1;               ///< tail of the corpus held out for validation
  /// What a text model reads: "text" (the characters of data_file) or "tokens" (the token
  /// shards of shards_dir, llm.c's format, with the BPE tokenizer of tokenizer_dir).
  std::string data_kind = "text";
  std::string shards_dir;                  ///< data.kind = tokens: directory of *train*.bin, *val*.bin
  std::string tokenizer_dir;               ///< data.kind = tokens: vocab.json + merges.txt
  // An image model (fed images and labels) reads an IDX dataset instead (core/image_source.hpp).
  std::string image_dir = "/usr/share/datasets/fashion-mnist";  ///< the four IDX files
  int64_t crop_padding = 0;                ///< random crops: pad by this many pixels (0: off)
  bool flip = false;                       ///< random horizontal flips
  int64_t batch = 16;                      ///< global batch (sequences per optimizer step)
  int64_t micro_batches = 1;               ///< pipeline micro-batches per step (must divide batch)
  /// train.micro-batches = auto: the estimator picks micro_batches among the divisors of batch
  /// (scheduler/micro_batches.hpp); micro_batches is then the count the profile is measured at.
  bool micro_batches_auto = false;
  /// Pipeline schedule (scheduler/schedule.hpp): "gpipe", "1f1b", or "auto" (the estimator's
  /// choice, printed at start with the predicted step time of both).
  std::string schedule = "auto";
  int64_t steps = 100;                     ///< optimizer steps to run in total (resume counts on)
  uint64_t seed = 1337;                    ///< parameter init and batch order
  optim_config optim;
  int64_t eval_every = 0;                  ///< validate every N steps (0: only at the end)
  int64_t eval_batches = 8;                ///< validation batches per evaluation (0: none)
  int64_t log_every = 10;                  ///< progress line every N steps
  std::string metrics_file;                ///< JSON lines; empty: none
  std::string checkpoint_file;             ///< checkpoint directory, or one ".ckpt" file (core/checkpoint_dir.hpp);
                                           ///< written every checkpoint_every steps and at the end
  int64_t checkpoint_every = 0;
  int64_t keep_checkpoints = 3;            ///< newest step files kept in a checkpoint directory (0: all)
  std::string resume_from;                 ///< checkpoint to start from
  int threads = 0;                         ///< actor scheduler threads (0: one per core)
  int blas_threads = 1;                    ///< OpenBLAS threads inside each op call
  std::string scheduler;                   ///< CAF scheduler: "stealing", "sharing"; empty: stealing in
                                           ///< one process, sharing with a cluster file (idle workers
                                           ///< of several processes on one host must not spin)
  /// Device of every op actor of a one-process run: "cpu", "cuda" or "cuda:N" (docs/cuda.md).
  /// With a cluster file each node's device comes from the cluster file instead.
  std::string device = "cpu";
  /// Comma-separated op-name globs ("lm_head, h1.*") that stay on the CPU although their
  /// actor's device is a GPU (runtime.device, or a cuda node of the cluster file).
  std::string cpu_ops;
  /// How the GEMMs of ops on a GPU compute: "fp32" or "bf16" (tensor-core products of f32 operands
  /// rounded to bf16, f32 sums; weights, activations and gradients stay f32). CPU ops: always f32.
  std::string precision = "fp32";
  double step_timeout_s = 600;             ///< a step that takes longer is a hang: abort
  double stop_grace_s = 5;                 ///< after stop_flag, a step still running this long is abandoned
  bool progress = true;                    ///< progress lines on stderr
  // ---- several processes (docs/cluster.md) ----
  std::string cluster_file;                ///< cluster file: op actors run on fusion-node processes
  std::string listen;                      ///< "HOST:PORT" to wait for nodes on (default: the cluster file's)
  std::string policy;                      ///< placement policy overriding the cluster file's (empty: the file's)
  /// Profile file (docs/scheduler.md): loaded instead of measuring the cluster when it exists,
  /// else written with what was measured; empty: measure, save nothing.
  std::string profile_file;
  double join_timeout_s = 60;              ///< every node of the cluster file must join within this
  int64_t heartbeat_ms = 250;              ///< CAF middleman heartbeat between processes
  int64_t peer_timeout_ms = 2000;          ///< a peer silent this long is dead (hung or gone)
  /// A lost node (docs/recovery.md): "auto" recovers on the survivors from a surviving replica or
  /// the last checkpoint, "off" fails the run; empty: auto when checkpoint_file is set, else off.
  std::string recovery_mode;
  /// Every this many completed steps each op streams its state to a holder on a buddy node of
  /// another site (peer-held snapshots, docs/recovery.md); 0: off.
  int64_t snapshot_every = 0;
  std::string transport = "tcp";           ///< cross-process tensors: "tcp" data channel or "caf" messages
  flow_config flow;                        ///< flow control of cross-process edges (core/wire.hpp)
  /// Codecs of cross-node edges ([compression], docs/compression.md): none, topk, adatopk, int8 or int4.
  compression_config compression;
  /// The live scheduler ([scheduler], docs/migration.md): on for OP-Fence cluster runs.
  rebalance_settings rebalance;
  // ---- admin shell (docs/admin.md) ----
  uint16_t admin_port = 0;                 ///< publish the admin actor on this port (0: off)
  /// The coordinator's identity (security/identity.hpp): the node and admin ports speak mutual
  /// TLS and admit by certificate. Null: plaintext, unauthenticated (security.mode=off).
  std::shared_ptr<const security::credentials> credentials;
  std::string admin_host = "127.0.0.1";    ///< address the admin actor listens on
  /// Called once the admin actor listens, with its port (tests connect fusion-admin from here).
  std::function<void(uint16_t port)> on_admin_listening;
  /// Called on the coordinator after every step with its record and the seconds since training
  /// started (fusion-train's Prometheus endpoint); must be quick.
  std::function<void(const step_record& rec, double elapsed_s)> on_step;
  /// Called once the coordinator listens, with its port (tests start their nodes from here).
  std::function<void(uint16_t port)> on_listening;
  /// When set (e.g. by a SIGINT handler) the run stops in whatever phase it is: while nodes
  /// join, at once; while training, after the step in flight (a step that does not finish within
  /// runtime.stop-grace seconds is abandoned), then writes the checkpoint if configured and
  /// returns with `interrupted` set (the session constructor throws fusion::interrupted_error
  /// when it happens before training).
  const std::atomic<bool>* stop_flag = nullptr;
};

/// train.schedule when it names a schedule; empty for "auto" (the estimator's choice, which
/// planners then make per candidate).
inline std::optional<pipeline_schedule> fixed_schedule(const train_config& cfg) {
  pipeline_schedule s;
  if (parse_schedule(cfg.schedule, s)) return s;
  return std::nullopt;
}

}  // namespace fusion
