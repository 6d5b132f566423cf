// What a run is made of before any actor exists (the session loads it; the coordinator owns it)
// and the phases the coordinator moves through (actors/coordinator.hpp). CAF-free.
#pragma once

#include <cstdint>
#include <memory>

#include "actors/train_config.hpp"
#include "core/cluster.hpp"
#include "core/data.hpp"
#include "core/data_source.hpp"
#include "core/graph.hpp"
#include "core/train_record.hpp"

namespace fusion {

/// The phases of a run.
enum class run_phase : uint8_t { joining, planning, wiring, ready, training, paused, finished, failed };

/// "joining", "planning", ...
const char* to_string(run_phase p);

/// What the session loaded before any actor existed (plain C++ that throws clear errors), and
/// where the coordinator leaves a training result before it answers train_atom.
struct run_inputs {
  train_config cfg;
  graph model;
  char_tokenizer tokenizer;                    ///< text models only (sampling, checkpoint vocabulary)
  std::shared_ptr<const text_dataset> text;    ///< text models only
  std::unique_ptr<data_source> data;           ///< fills the model's feeds (core/data_source.hpp)
  cluster_spec cluster;       ///< no nodes: a one-process run
  train_result result;        ///< of the last train_atom
};

}  // namespace fusion
