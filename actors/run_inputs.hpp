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
#include "tokenizer/bpe.hpp"

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
  char_tokenizer tokenizer;                    ///< character text (data.kind = text): sampling, checkpoints
  /// The BPE tokenizer of token shards (data.kind = tokens): sampling, checkpoints. Null otherwise.
  std::shared_ptr<const tok::bpe_tokenizer> bpe;
  std::shared_ptr<const text_dataset> text;    ///< text models only
  std::unique_ptr<data_source> data;           ///< fills the model's feeds (core/data_source.hpp)
  cluster_spec cluster;       ///< no nodes: a one-process run
  train_result result;        ///< of the last train_atom
};

/// Token ids of `text` with the run's tokenizer (BPE or characters).
inline std::vector<int32_t> encode_text(const run_inputs& in, const std::string& text) {
  return in.bpe ? in.bpe->encode(text) : in.tokenizer.encode(text);
}
/// The bytes of token ids with the run's tokenizer.
inline std::string decode_tokens(const run_inputs& in, std::span<const int32_t> ids) {
  return in.bpe ? in.bpe->decode(ids) : in.tokenizer.decode(ids);
}
/// The run's tokenizer's vocabulary size (the model's may be larger: those rows are never sampled).
inline int tokenizer_size(const run_inputs& in) { return in.bpe ? in.bpe->size() : in.tokenizer.size(); }

}  // namespace fusion
