// train.micro-batches = auto in a run (actors/micro_batches_auto.cpp; the choice itself is
// scheduler/micro_batches.hpp). The coordinator's half is declared in coordinator_state.hpp.
#pragma once

#include <cstdint>

#include "actors/train_config.hpp"

namespace fusion {

/// A one-process run with train.micro-batches = auto: times the model's ops on cfg.device at
/// cfg.micro_batches (the reference count), predicts every divisor of cfg.batch (one node, so
/// no pipeline bubble: only the GEMMs' efficiency and memory differ), prints the choice when
/// cfg.progress, and returns it. Throws std::runtime_error when the model cannot be loaded or
/// timed (the message names the file or the op).
int64_t choose_local_micro_batches(const train_config& cfg);

}  // namespace fusion
