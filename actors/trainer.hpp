// The coordinator of a training run: loads the model and data, spawns one op actor per OP-DAG
// node, feeds micro-batches, collects losses and gradient norms, and drives optimizer steps,
// evaluation, checkpoints and sampling. This header is CAF-free so apps and tests stay light.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/optim.hpp"

namespace fusion {

/// Everything a training run is configured with (fusion-train maps its INI file onto this).
struct train_config {
  std::string model_file;                  ///< OP-DAG model (.pbtxt)
  std::string data_file = "data/kjv.txt";  ///< training text
  std::string vocab_file;                  ///< character vocabulary: loaded if it exists, else built
                                           ///< from the corpus and written there; empty: built, not saved
  double val_fraction = 0.1;               ///< tail of the corpus held out for validation
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
  double step_timeout_s = 600;             ///< a step that takes longer is a hang: abort
  bool progress = true;                    ///< progress lines on stderr
  /// When set (e.g. by a SIGINT handler), train() stops after the step in flight, writes the
  /// checkpoint (if configured) and returns with `interrupted` set.
  const std::atomic<bool>* stop_flag = nullptr;
};

/// One optimizer step's record.
struct step_record {
  int64_t step = 0;        ///< 1-based: the number of steps done after this one
  double loss = 0;         ///< mean training loss of the global batch
  double lr = 0;
  double grad_norm = 0;    ///< before clipping
  double tokens_per_s = 0; ///< of this step
};

/// What a call to session::train returns.
struct train_result {
  std::vector<step_record> steps;
  std::vector<std::pair<int64_t, double>> val_losses;  ///< (step, validation loss)
  double tokens_per_s = 0;                              ///< over the whole call
  double seconds = 0;
  double peak_rss_mb = 0;
  bool interrupted = false;                             ///< stopped early by stop_flag
};

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
  /// Mean validation loss over cfg.eval_batches batches.
  double evaluate();
  /// Generates `n` characters after `prompt` (temperature <= 0: greedy).
  std::string sample(int n, const std::string& prompt, double temperature, uint64_t seed);
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

  int64_t step() const;
  int64_t param_count() const;
  /// Number of op actors (one per OP-DAG node, inputs included).
  size_t actor_count() const;
  /// Entropy of the training split's character distribution, in nats.
  double unigram_entropy() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

}  // namespace fusion
