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

#include "actors/train_config.hpp"
#include "base/result.hpp"
#include "core/train_record.hpp"

namespace fusion {

/// Thrown by the session constructor when stop_flag is raised before training starts (while
/// nodes join or the run is wired); fusion-train exits 130 on it.
struct interrupted_error : error {
  using error::error;
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
  /// Mean loss (and accuracy, when the loss op reports it; bits per byte for text) over
  /// cfg.eval_batches evaluation batches: the validation split of a corpus or of token shards,
  /// the test split of an image dataset.
  eval_result evaluate();
  /// Generates `n` tokens (characters, or BPE tokens of data.kind = tokens) after `prompt`, as
  /// text (temperature <= 0: greedy).
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
  /// Micro-batches per step: train.micro-batches, or what auto chose (train_config::micro_batches_auto).
  int64_t micro_batches() const;
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
