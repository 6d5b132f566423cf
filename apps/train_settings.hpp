// fusion-train's settings: the option table (every [category] key of its INI file and command
// line, mapped onto train_config), and the checks and conversions run on them before anything is
// loaded. apps/fusion_train.cpp runs the program.
#pragma once

#include <cstdint>
#include <string>

#include "actors/trainer.hpp"
#include "apps/app_options.hpp"

namespace fusion {

/// The most characters one sampling request generates: one forward pass each, which Ctrl-C does
/// not cut short.
constexpr int64_t max_sample_chars = 100000;

/// [sample] and output.sample-chars: text generated from a checkpoint or after training.
struct sample_options {
  int64_t count = 0;
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t after_training = 200;
};

/// Every setting of fusion-train: train_config plus what only the program reads.
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


  /// Fills the option table (the rows of docs/training.md) with the defaults of train_config.
  train_app_config();
};

/// Settings that are wrong whatever the model and data: reported as usage errors (exit 2)
/// before anything is loaded, all of them at once (one per line). Throws usage_error.
void check_settings(const train_app_config& cfg);

/// train.micro-batches onto train_config (after check_settings): auto resolves to the middle
/// divisor of the batch (at most 64 micro-batches), where the profile is measured.
void apply_micro_batches(train_app_config& cfg);

/// [compression] strings and unsigned keys onto train_config::compression (after check_settings).
void apply_compression(train_app_config& cfg);

}  // namespace fusion
