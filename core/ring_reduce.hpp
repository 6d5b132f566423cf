// One replica's side of a ring all-reduce: R replicas of an op sum their gradient buffers so that
// every replica ends with the same, bit-identical sum. Plain C++ without actors: the op actor
// (actors/op_actor.cpp) feeds it the messages of its ring predecessor and sends what it returns
// to its successor; tests drive R of them directly (tests/core/ring_reduce_test.cpp).
//
// The buffer of n floats is cut into R near-equal chunks, chunk c = [n c / R, n (c + 1) / R).
// Replica r sends to replica (r + 1) % R. There are 2 (R - 1) ring steps k:
//   reduce-scatter, k < R - 1: message k into replica r carries chunk (r - 1 - k) mod R; the
//     receiver stores arrived + own (its running sum) and sends that chunk on as message k + 1;
//   all-gather, k >= R - 1: message k carries chunk (r - (k - R + 1)) mod R, finished by its
//     last adder; the receiver copies it and sends it on.
// Message 0 of replica r carries its own chunk r. Each chunk is summed once, along the ring from
// replica c to replica c - 1, then only copied, so every replica holds the same bits.
//
// f16 values (train.allreduce=f16): every message's values are rounded to the nearest f16 (ties
// to even) before they leave, and so is the sender's own copy of that chunk, so an f16 codec on
// the ring's edges carries them exactly; the replica that finishes a chunk's sum rounds it in
// place before the all-gather, and every replica ends with the same, rounded bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace fusion {

/// One replica's part of a ring all-reduce of a float buffer.
class ring_reducer {
 public:
  /// A message to send to the ring successor: ring step k and the chunk's values.
  struct message {
    uint32_t k = 0;
    std::vector<float> values;
  };

  /// Replica `replica` of `replicas` (>= 2); throws std::invalid_argument otherwise. With
  /// `f16_values`, what is sent (and the sum) is rounded to f16 precision.
  ring_reducer(uint32_t replica, uint32_t replicas, bool f16_values = false);

  /// This replica's own values are ready (called once): returns what to send now, message 0
  /// and whatever messages that arrived early allow.
  std::vector<message> start(std::vector<float> values);
  /// Message `k` of the predecessor arrived (in any order, each k once; kept until start when it
  /// is early): returns what to send now. Throws std::invalid_argument for a k out of range, a
  /// repeated k or a chunk of the wrong length.
  std::vector<message> receive(uint32_t k, std::vector<float> chunk);

  /// Whether every ring step is done: values() is the sum over all replicas.
  bool done() const { return started_ && next_ == steps(); }
  /// Ring steps of the whole all-reduce: 2 (R - 1).
  uint32_t steps() const { return 2 * (replicas_ - 1); }
  /// The buffer: own values until done, the sum after.
  std::vector<float>& values() { return values_; }

  /// Chunk `c` of a buffer of `n` floats split `parts` ways: [begin, end).
  static std::pair<size_t, size_t> chunk_range(size_t n, uint32_t c, uint32_t parts);
  /// The chunk that message `k` into replica `replica` of `replicas` carries.
  static uint32_t chunk_of(uint32_t replica, uint32_t replicas, uint32_t k);

 private:
  std::vector<message> drain();
  /// Chunk [a, b) of the buffer as a message of ring step k (rounded to f16 first in f16 mode).
  message send_chunk(uint32_t k, size_t a, size_t b);

  uint32_t replica_, replicas_;
  bool f16_ = false;
  bool started_ = false;
  uint32_t next_ = 0;                             // the ring step to process next
  std::vector<float> values_;
  std::map<uint32_t, std::vector<float>> early_;  // messages not processed yet, by k
};

}  // namespace fusion
