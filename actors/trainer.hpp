// The coordinator of a training run: loads the model and data, spawns one op actor per OP-DAG
// node, feeds micro-batches, collects losses and gradient norms, and drives optimizer steps,
// evaluation, checkpoints and sampling. This header is CAF-free so apps and tests stay light.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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
  // An image model (fed images and labels) reads an IDX dataset instead (core/image_source.hpp).
  std::string image_dir = "/usr/share/datasets/fashion-mnist";  ///< the four IDX files
  int64_t crop_padding = 0;                ///< random crops: pad by this many pixels (0: off)
  bool flip = false;                       ///< random horizontal flips
  int64_t batch = 16;                      ///< global batch (sequences per optimizer step)
  int64_t micro_batches = 1;               ///< pipeline micro-batches per step (must divide batch)
  int64_t steps = 100;                     ///< optimizer steps to run in total (resume counts on)
  uint64_t seed = 1337;                    ///< parameter init and batch order
  optim_config optim;
  int64_t eval_every = 0;                  ///< validate every N steps (0: only at the end)
  int64_t eval_batches = 8;                ///< validation batches per evaluation (0: none)
  int64_t log_every = 10;                  ///< progress line every N steps
  std::string metrics_file;                ///< JSON lines; empty: none
  std::string checkpoint_file;             ///< written every checkpoint_every steps and at the end
  int64_t checkpoint_every = 0;
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
  std::string transport = "tcp";           ///< cross-process tensors: "tcp" data channel or "caf" messages
  flow_config flow;                        ///< flow control of cross-process edges (core/wire.hpp)
  /// Codecs of cross-node edges ([compression], docs/compression.md): none, topk or adatopk.
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
  /// Called once the coordinator listens, with its port (tests start their nodes from here).
  std::function<void(uint16_t port)> on_listening;
  /// When set (e.g. by a SIGINT handler) the run stops in whatever phase it is: while nodes
  /// join, at once; while training, after the step in flight (a step that does not finish within
  /// runtime.stop-grace seconds is abandoned), then writes the checkpoint if configured and
  /// returns with `interrupted` set (the session constructor throws fusion::interrupted_error
  /// when it happens before training).
  const std::atomic<bool>* stop_flag = nullptr;
};

/// Thrown by the session constructor when stop_flag is raised before training starts (while
/// nodes join or the run is wired); fusion-train exits 130 on it.
struct interrupted_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a call to session::train returns.
struct train_result {
  /// The last step_records_kept steps of the call, oldest first; only the last
  /// measured_steps_kept of them keep their measurements (`ops`, `edges`). The metrics file
  /// (output.metrics) has every step in full.
  std::vector<step_record> steps;
  int64_t steps_run = 0;                                ///< steps done by the call
  std::vector<std::pair<int64_t, double>> val_losses;  ///< (step, validation loss)
  std::vector<std::pair<int64_t, double>> val_accuracies;  ///< (step, accuracy), when reported
  double tokens_per_s = 0;                              ///< over the whole call (images/s for
                                                        ///< an image model: rows x row_items)
  double seconds = 0;
  double peak_rss_mb = 0;
  bool interrupted = false;                             ///< stopped early by stop_flag
};

/// How many of the most recent steps and evaluations a train_result keeps. The coordinator
/// writes every one to the metrics file as it ends; what stays in memory must not grow with the
/// length of the run (about 100 bytes a step: 10 MiB at most).
inline constexpr size_t step_records_kept = 100000;
/// How many of the kept steps keep their per-op and per-edge measurements (about 9 KiB a step
/// for gpt-char-small's 61 compute ops: keeping them all grew a 1,000-step run by 9 MiB).
inline constexpr size_t measured_steps_kept = 8;

/// Appends a finished step to r.steps (counting it in r.steps_run) and drops what falls out of
/// the bounds: the oldest records beyond `keep`, the measurements of those before the last
/// `keep_measured`. Constant time per step (amortized).
void add_step_record(train_result& r, step_record rec, size_t keep = step_records_kept,
                     size_t keep_measured = measured_steps_kept);

/// Appends an evaluation of step `step` (NaN accuracy: none reported) to r.val_losses and
/// r.val_accuracies, keeping the last `keep` of each.
void add_eval_record(train_result& r, int64_t step, const eval_result& v, size_t keep = step_records_kept);

/// A running system of op actors for one model. Throws std::runtime_error with a clear message
/// for bad configuration, model or data, and when any op actor reports a failure.
class session {
 public:
  explicit session(train_config cfg);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Trains from the current step up to cfg.steps.
  train_result train();
  /// Mean loss (and accuracy, when the loss op reports it) over cfg.eval_batches evaluation
  /// batches: the validation split of a corpus, the test split of an image dataset.
  eval_result evaluate();
  /// Generates `n` characters after `prompt` (temperature <= 0: greedy).
  std::string sample(int n, const std::string& prompt, double temperature, uint64_t seed);
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

  /// Replaces every cross-node edge by a fresh edge sender with a new id at the next step
  /// boundary (at once when no step runs); returns once done. Safe from another thread while
  /// train() runs. The losses are unchanged by it (tests/actors/rewire_test.cpp).
  void rewire();
  /// The coordinator's answer to an admin query (actors/admin_protocol.hpp), as JSON. Safe from
  /// another thread while train() runs.
  std::string query(const std::string& topic);
  /// An admin command (pause, resume, ...), as JSON; throws std::runtime_error with the reason.
  std::string command(const std::string& verb, const std::vector<std::string>& args = {});

  int64_t step() const;
  int64_t param_count() const;
  /// Number of op actors (one per OP-DAG node, inputs included).
  size_t actor_count() const;
  /// What throughput counts: "tokens" for a text model, "images" for an image model.
  std::string item_name() const;
  /// Whether the model reads text (and so can sample).
  bool is_text() const;
  /// One line on the data source, e.g. "text data/kjv.txt: ... tokens".
  std::string describe_data() const;
  /// Nodes of the cluster file this session runs on (empty without one).
  std::vector<std::string> cluster_nodes() const;
  /// Entropy of the training split's character distribution, in nats (NaN for an image model).
  double unigram_entropy() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

}  // namespace fusion
