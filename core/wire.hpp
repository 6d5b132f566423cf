// The wire format of tensors that cross a process boundary: a versioned header
// (proto/wire.proto) followed by the tensor's raw bytes, split into chunks far below any
// transport's message limit. This file is transport-free: the CAF path (actors/edge_actor.cpp)
// and the TCP data channel (net/) both frame bytes with it, and both validate with it.
//
// A receiver must never trust a header: decode_wire_header checks the version, the dtype, that
// the shape's byte size equals total_bytes and that the chunk lies inside the tensor and matches
// the payload that actually arrived. wire_assembler then writes chunks in place into one tensor.
// A compressed edge (compression/codec.hpp) sends its codec's payload instead of the raw bytes;
// its chunks are assembled into a payload buffer whose size the header announces (refused when
// it lies outside what that codec's payload of the tensor can measure) and decoded into the
// dense tensor at the end, by the codec the header's encoding names (codec_on_wire).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "base/result.hpp"
#include "compression/codec.hpp"
#include "tensor/tensor.hpp"

namespace fusion {

/// Version of the wire header and of the node protocol; nodes refuse peers that speak another.
/// 2: the coordinator answers hello with welcome or a refusal error; errors are fusion errors.
/// 3: nodes answer profile_atom (op timings, CPU share, free memory) and probe_atom (a link
/// probe to another node's data channel) before placement.
/// 4: wire headers carry an encoding (raw or topk payload) and the payload's size; edge senders
/// take codec settings (edge_atom, compress_atom).
/// 5: admission by certificate: challenge_atom, and node_hello carries a security::proof.
/// 6: live migration: export_atom, import_atom, retire_atom and state tensors (pass_mode::state).
/// 7: stage replicas: the reduce direction (gradient ring), reduce_atom, connect_atom with per
/// micro-batch sinks and the replica ring, grads_atom names the replica; encodings 3 (int8) and 4
/// (int4), and codec settings carry the quantizing codecs' scale_block.
/// 8: pipeline schedules: connect_atom's replica ring carries the live bound and GPipe's
/// forwards-first rule, grads_atom the peak of live micro-batches; grads_atom also carries what
/// the replica's all-reduce measured (reduce_timing), and replica_ring whether the ring carries
/// f16 values. 9: edge_atom says whether the receiver dials the data channel (nodes behind a
/// firewall, docs/transport.md). 11: forget_peer_atom (a lost node's data-channel connections
/// are dropped by the others, docs/recovery.md). 12: device_timing carries the node's CPU quota
/// and period (docs/scheduler.md, "Nodes under a CPU quota"). 13: node_stats carries the node
/// process's CPU seconds since the last poll. 14: edge_stat counts the tensors that found their
/// edge idle (idle_starts). 15: node_stats carries the CPU quota the node runs under now.
inline constexpr uint32_t wire_protocol_version = 15;

/// Largest tensor a header may announce (16 GiB); anything larger is a corrupt header.
inline constexpr uint64_t wire_max_tensor_bytes = uint64_t{1} << 34;

/// Most tensors one wire_assembler holds partly received at once (on the data channel, one per
/// sender's connection; over CAF, one per node): an edge has at most its flow window of chunks in
/// flight, so a sender past this many is broken or hostile, and each partial tensor it opened
/// would hold its memory.
inline constexpr size_t wire_max_partial_tensors = 4096;

/// Flow control of a cross-process edge ([flow] in the run config): the one home of its defaults
/// and limits.
struct flow_config {
  uint32_t window = 4;                       ///< chunks sent but not yet acknowledged, per edge
  uint64_t chunk_bytes = uint64_t{4} << 20;  ///< largest chunk of a tensor
  /// Largest chunk any transport carries (far below CAF's 4 GiB message ceiling).
  static constexpr uint64_t max_chunk_bytes = uint64_t{1} << 30;
  /// Largest window a run may set: every edge to one node shares that node's connection, whose
  /// send queue holds 4,096 chunks, and a full queue fails the run rather than waiting. 64 chunks
  /// of 4 MiB keep a 100 ms round trip busy at 20 Gbit/s.
  static constexpr uint32_t max_window = 64;
  /// window at least 1; chunk_bytes in [1, max_chunk_bytes] (0 means the largest).
  flow_config clamped() const {
    flow_config out = *this;
    if (out.window == 0) out.window = 1;
    if (out.chunk_bytes == 0 || out.chunk_bytes > max_chunk_bytes) out.chunk_bytes = max_chunk_bytes;
    return out;
  }
};

/// forward: activation; backward: gradient; reduce: one ring step of a replicated op's gradient
/// all-reduce (the header's micro_batch is the ring step k).
enum class wire_direction : uint8_t { forward = 1, backward = 2, reduce = 3 };

/// The decoded form of pb::wire_header.
struct wire_header {
  uint32_t version = wire_protocol_version;
  wire_direction dir = wire_direction::forward;
  uint64_t edge = 0;
  uint64_t step = 0;
  uint32_t micro_batch = 0;  ///< reduce: the ring step k
  uint32_t slot = 0;         ///< forward: input slot of the consumer; backward: index at the producer
  uint8_t mode = 0;          ///< pass_mode of the forward pass
  dtype type = dtype::f32;
  shape_t shape;
  uint64_t total_bytes = 0;  ///< bytes of the dense tensor
  uint64_t offset = 0;       ///< of this chunk in the payload
  uint64_t chunk_bytes = 0;
  codec_kind encoding = codec_kind::none;  ///< none (raw bytes) or a codec's wire_encoding
  uint64_t payload_bytes = 0;              ///< of the whole payload; total_bytes when not encoded

  /// Bytes that cross the wire for the whole tensor.
  uint64_t wire_bytes() const { return encoding == codec_kind::none ? total_bytes : payload_bytes; }
};

/// Serializes a header (protobuf binary).
std::string encode_wire_header(const wire_header& h);

/// Parses `bytes` and validates the header against the `payload_bytes` that arrived with it.
/// Fails with a message that says what is wrong, e.g. "wire protocol version 7, this node
/// speaks 1" or "truncated payload: header announces 4096 bytes, 4000 arrived".
result<wire_header> decode_wire_header(std::string_view bytes, uint64_t payload_bytes);

/// Chunk headers for sending a payload of `base.wire_bytes()` bytes in pieces of at most
/// `chunk_limit` bytes (one chunk for an empty tensor).
std::vector<wire_header> split_into_chunks(const wire_header& base, uint64_t chunk_limit);

/// Reassembles chunked tensors in place. Keyed by (edge, direction, step, micro-batch), so chunks
/// of different messages may interleave. Not thread-safe: one assembler per receiving thread or
/// actor. A tensor's memory is reserved on its first chunk but left unwritten (the pages are the
/// system's until bytes arrive), so a header announcing a large tensor costs nothing until its
/// bytes come; destroying the assembler frees what its partial tensors hold.
class wire_assembler {
 public:
  /// Where the payload of chunk `h` (already validated) must be written, allocating the tensor
  /// on its first chunk (null for an empty tensor). Fails when the chunk disagrees with earlier
  /// chunks of the same tensor (shape, dtype), repeats an offset or overlaps an earlier chunk
  /// (the bytes received would add up while a hole stayed unwritten), when it would open a tensor
  /// beyond wire_max_partial_tensors, or when the tensor's memory cannot be had.
  result<std::byte*> begin_chunk(const wire_header& h);

  /// After the payload of `h` was written: the whole tensor when this was its last chunk
  /// (decoded when the edge is compressed), else nothing. Fails when the payload does not decode.
  result<std::optional<tensor>> end_chunk(const wire_header& h);

  /// Forgets the partly received tensors of edge `edge`, whose route was removed (a plan given
  /// up: their sender is lost, or will never send the rest); returns how many there were.
  size_t drop_edge(uint64_t edge);

  /// Tensors with some but not all chunks received.
  size_t partial_count() const { return partial_.size(); }
  /// The edges of those tensors, ascending, each once.
  std::vector<uint64_t> partial_edges() const;

 private:
  using key_t = std::tuple<uint64_t, uint8_t, uint64_t, uint32_t>;
  struct partial {
    tensor value;                            // raw: the tensor itself; encoded: allocated on decode
    std::unique_ptr<std::byte[]> payload;    // encoded: the payload being assembled, not zeroed
    uint64_t payload_bytes = 0;
    shape_t shape;
    dtype type = dtype::f32;
    codec_kind encoding = codec_kind::none;
    uint64_t received = 0;
    std::map<uint64_t, uint64_t> chunks;  // offset -> end of every chunk received
  };
  std::map<key_t, partial> partial_;
};

}  // namespace fusion
