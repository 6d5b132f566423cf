// Peer-held snapshots of an op's state (docs/recovery.md, recovery.snapshot-every): the pure
// logic kept by each snapshot holder actor (actors/snapshot_holder.hpp), plus the choice of the
// buddy node that holds a node's snapshots. No CAF here: tested directly.
//
// A snapshot of step S is the op's state tensors (parameters, optimizer moments, buffers, in the
// op's own order) after the optimizer update of step S. They arrive one by one, by index; the
// sender's checksum (snapshot_checksum) arrives apart, in either order. A snapshot counts once
// every tensor is in and the checksum of what arrived equals the sender's: a partial stream or a
// damaged one is never used, and the older complete snapshot stays until a newer one counts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "tensor/tensor.hpp"

namespace fusion {

/// Complete snapshots a holder keeps, on the op's own node and on its buddy. Two on the buddy
/// too: a node lost while its ops' snapshots of step S stream out leaves some of them complete
/// at S on the buddy and others only at the step before; with one kept, those that completed S
/// had dropped it, no step was common to every op and the recovery fell back to the checkpoint.
inline constexpr uint32_t snapshot_keep_local = 2;
inline constexpr uint32_t snapshot_keep_buddy = 2;

/// XXH64 over the tensor_hash (dtype, shape, bytes) of every tensor, in order: the checksum a
/// snapshot's sender computes and its holder verifies.
uint64_t snapshot_checksum(const std::vector<tensor>& tensors);

/// The snapshots of one op that one holder keeps.
class snapshot_store {
 public:
  /// `tensors`: how many state tensors a snapshot of this op has (> 0). `keep`: how many complete
  /// snapshots stay (newest first, >= 1); a holder on the op's own node keeps 2, so that a
  /// buddy one snapshot behind still finds a common step.
  explicit snapshot_store(uint32_t tensors, size_t keep = 1);

  /// Tensor `index` of the snapshot of `step`. Refused (the failure says why, the store is
  /// unchanged) when the index is out of range, the tensor came already, or a complete snapshot
  /// of that step or a newer one is held. Returns true when this made the snapshot whole (every
  /// tensor in; it still needs its checksum to count).
  result<bool> add(uint64_t step, uint32_t index, tensor t);
  /// The sender's checksum of the snapshot of `step`. Once every tensor is in as well, the
  /// checksum of what arrived is compared: equal, the snapshot counts and snapshots beyond
  /// `keep` (and partial ones of older steps) are dropped; different, the snapshot is dropped
  /// and the failure says so. A checksum for a step already complete or superseded is refused.
  status seal(uint64_t step, uint64_t checksum);
  /// The checksum of the snapshot of `step` when every tensor is in (the holder on the sender's
  /// node seals with it), else nothing.
  std::optional<uint64_t> checksum_of(uint64_t step) const;

  /// Steps of the complete, verified snapshots, newest first.
  std::vector<uint64_t> complete_steps() const;
  /// The tensors of the complete snapshot of `step`, in index order; nothing when not held.
  std::optional<std::vector<tensor>> get(uint64_t step) const;
  /// Steps with a snapshot still arriving (partial, or whole without its checksum), oldest first.
  std::vector<uint64_t> pending_steps() const;
  /// Bytes of tensors held, complete and pending.
  uint64_t bytes() const;
  uint32_t tensors_per_snapshot() const noexcept { return tensors_; }

 private:
  struct partial {
    std::vector<tensor> tensors;
    std::vector<bool> have;
    uint32_t count = 0;
    std::optional<uint64_t> checksum;
  };
  status try_complete(uint64_t step);

  uint32_t tensors_;
  size_t keep_;
  std::map<uint64_t, std::vector<tensor>> complete_;  // by step
  std::map<uint64_t, partial> pending_;                // by step
};

/// The buddy of every node: who holds its snapshots. Node i's buddy is the next node after it in
/// file order (wrapping around) that is alive and on another site; with no live node on another
/// site, the next live node on its own site; -1 for a dead node or when no other node lives.
/// `sites[i]`: node i's site name.
std::vector<int> snapshot_buddies(const std::vector<std::string>& sites, const std::vector<bool>& alive);

/// The newest step held for every op: `held[op]` lists the steps some holder has complete for
/// op `op` (any order, duplicates allowed). Nothing when an op has none or no step is common.
std::optional<uint64_t> newest_common_step(const std::vector<std::vector<uint64_t>>& held);

}  // namespace fusion
