// The actor that keeps the peer-held snapshots of one op (docs/recovery.md): its store's rules
// are core/snapshot_store.hpp, its interface snapshot_holder in actors/messages.hpp.
//
// Two holders per op: one on the op's own node (keeps the 2 newest snapshots, so that the
// survivors can rewind to a step the buddy holds as well) that passes every tensor on to the
// edge sender towards the buddy node and, once a snapshot is whole, sends the buddy's holder its
// checksum; and one on the buddy (keeps the newest, and the one still arriving), which counts a
// snapshot only whole and with a matching checksum. Refused tensors and damaged snapshots are
// logged and dropped: a snapshot never fails the run.
#pragma once

#include <caf/all.hpp>

#include <string>

#include "actors/messages.hpp"

namespace fusion {

/// Spawns the holder of the snapshots of op `op_name` (`tensors` state tensors each), keeping
/// the `keep` newest complete ones. With `forward` (the holder on the op's node): every tensor
/// is passed on there too, and each whole snapshot's checksum goes to `buddy`. `who` prefixes
/// its log lines ("fusion-node n1").
snapshot_holder spawn_snapshot_holder(caf::actor_system& sys, std::string who, std::string op_name, uint32_t tensors,
                                      uint32_t keep, edge_sender_actor forward, snapshot_holder buddy);

}  // namespace fusion
