// Checkpoint file: training step, model name, free-text metadata and named tensors (parameters
// and optimizer state), in one checksummed binary file that is replaced atomically.
//
// Format version 1, all integers little-endian:
//
//     offset  size  field
//     0       8     magic "FUSNCKPT"
//     8       4     u32 format version (1)
//     12      4     u32 flags (0; reserved)
//     16      8     u64 file size in bytes, trailer included (detects truncation early)
//     24      8     u64 step
//     32      4     u32 tensor count
//     36      4     u32 model name length L, then L bytes
//             4     u32 meta length M, then M bytes
//     per tensor:
//             4     u32 name length (1..4096), then the name bytes (unique within the file)
//             1     u8 dtype (0 f32, 1 i32, 2 f64, as fusion::dtype)
//             1     u8 rank R (0..16; 0 is a scalar)
//             2     u16 reserved (0)
//             8*R   i64 dims
//             8     u64 data bytes (== numel * element size), then the raw elements
//     trailer:
//             8     u64 XXH64 (seed 0) of every byte before the trailer
//
// Shape legend: none (tensors keep the shapes they were saved with).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.hpp"

struct XXH64_state_s;  // xxhash.h's XXH64_state_t

namespace fusion {

/// Everything a training run needs to resume.
struct checkpoint {
  uint64_t step = 0;          ///< optimizer steps completed
  std::string model_name;
  std::string meta;           ///< free text, e.g. the run config
  std::vector<std::pair<std::string, tensor>> tensors;
};

/// Writes `ckpt` to path + ".tmp", flushes it to disk, then renames it over `path`, so a crash
/// leaves either the old checkpoint or the new one under `path`, never a partial file. Throws
/// std::invalid_argument for an empty, overlong or duplicate tensor name, a tensor without
/// storage or a tensor holding NaN or infinity (a diverged run must never replace a good
/// checkpoint; nothing is written then), and std::runtime_error naming the file when writing fails.
void save_checkpoint(const std::string& path, const checkpoint& ckpt);

/// The name of the first tensor of `ckpt` (in its order) that holds a NaN or an infinity;
/// nothing when every value is finite. Integer tensors are always finite.
std::optional<std::string> first_non_finite(const checkpoint& ckpt);

/// Reads and verifies a checkpoint. Throws std::runtime_error "checkpoint PATH: problem" for a
/// missing file, bad magic, unsupported version, truncated or oversized file, malformed or
/// absurd fields (checked against the file size before anything is allocated) and checksum
/// mismatch.
checkpoint load_checkpoint(const std::string& path);

/// The tensor saved under `name`, or nullptr.
const tensor* find_tensor(const checkpoint& ckpt, const std::string& name);

/// Streaming XXH64 (Yann Collet's xxHash, 64-bit; libxxhash's implementation): the checkpoint
/// checksum. It runs at memory speed, unlike byte-at-a-time hashes, which matters for
/// checkpoints of hundreds of MB. Move-only (it owns libxxhash's state).
class xxh64_hasher {
 public:
  /// Throws std::bad_alloc when libxxhash cannot allocate its state.
  explicit xxh64_hasher(uint64_t seed = 0);
  void update(const void* data, size_t len);
  /// Hash of everything passed to update() so far (the state is left unchanged).
  uint64_t digest() const;

 private:
  // libxxhash's state is an incomplete type outside xxhash.h, which stays out of this header.
  struct state_deleter {
    void operator()(XXH64_state_s* s) const;
  };
  std::unique_ptr<XXH64_state_s, state_deleter> state_;
};

/// One-shot XXH64 of a byte range.
uint64_t xxh64(std::span<const std::byte> data, uint64_t seed = 0);

/// XXH64 of a tensor: its dtype, shape and bytes (two tensors hash alike only when all agree).
uint64_t tensor_hash(const tensor& t);

/// The state of one replica of an op, for replica_divergence: the cluster node it runs on and
/// its named tensors (as an op actor hands them over for a checkpoint).
struct replica_state {
  std::string node;
  const std::vector<std::pair<std::string, tensor>>* tensors = nullptr;
};

/// The divergence detector of stage replicas: replicas of an op apply the same all-reduced
/// gradients, so their parameters and optimizer state must stay bit-identical. Compares every
/// replica with replica 0 (replicas[0]) by tensor_hash, tensor by tensor in replica 0's order,
/// skipping the names in `skip`; nothing when they agree, else "replicas of op 'X' diverged:
/// node a1 and node a2 differ in X/w" for the first tensor and replica that differ (a tensor
/// missing from a replica, or one it has in addition, counts as a difference).
std::optional<std::string> replica_divergence(const std::string& op, const std::vector<replica_state>& replicas,
                                              const std::vector<std::string>& skip = {});

/// Per-replica buffers (batch-norm running statistics: each replica updates them from its own
/// micro-batches) averaged for a checkpoint: every f32 tensor of `first` named in `keys` becomes
/// the mean over `first` and `others` (same name, shape and type), replica k weighted by
/// weights[k] (its micro-batches per step; weights[0] is `first`'s). A tensor another replica
/// lacks, or holds in another shape, leaves `first`'s as it is.
void average_replica_buffers(std::vector<std::pair<std::string, tensor>>& first,
                             const std::vector<const std::vector<std::pair<std::string, tensor>>*>& others,
                             const std::vector<std::string>& keys, const std::vector<double>& weights);

}  // namespace fusion
