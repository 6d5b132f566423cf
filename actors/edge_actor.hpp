// The sending end of a cross-process edge of the OP-DAG. To the op actor upstream it looks like
// any neighbour: it accepts the same forward_atom / backward_atom messages. It splits each tensor
// into wire chunks (core/wire.hpp), ships them to the node actor at the receiving end and keeps
// at most `window` chunks unacknowledged (credit_atom), so a slow link holds back the sender
// instead of piling up unbounded bytes inside CAF's buffers, which have no back-pressure. It
// measures every tensor it sends, from the first chunk out to the last chunk acknowledged, and
// reports it to its node (stats_atom). On a compressed edge it encodes every f32 tensor with its
// codec (compression/codec.hpp) and ships the payload instead of the raw bytes; compress_atom
// changes the codec between two tensors.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "compression/codec.hpp"
#include "core/wire.hpp"
#include "tensor/tensor.hpp"

namespace fusion {

/// A byte path to the receiving node that bypasses CAF's serialization (the TCP data channel).
/// The edge actor still counts credits; the link only moves bytes.
class data_link {
 public:
  virtual ~data_link() = default;
  /// Queues header + `length` bytes of `source` at `offset`; must not block for long and must
  /// keep `source` alive until the bytes are written. An error ends the run through `on_error`.
  virtual void send(std::string header, std::shared_ptr<const std::byte> source, uint64_t offset,
                    uint64_t length) = 0;
  /// Drops what is queued and closes at once (the peer was lost: nothing would be delivered).
  virtual void abort() {}
};

/// Spawns the sending end of edge `edge`. Chunks go to `peer` (the receiving node actor) as
/// wire_atom messages, or through `link` when it is set. Completed tensors are reported to
/// `reporter` as stats_atom(edge_stat); errors as fail_atom(caf::error). `codec` says how
/// tensors are encoded (none: raw bytes).
edge_sender_actor spawn_edge_sender(caf::actor_system& sys, uint64_t edge, node_inbox peer, edge_config cfg,
                                    node_inbox reporter, std::shared_ptr<data_link> link = nullptr,
                                    codec_settings codec = {});

}  // namespace fusion
