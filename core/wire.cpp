#include "core/wire.hpp"

#include <algorithm>
#include <iterator>
#include <new>
#include <span>

#include "wire.pb.h"

namespace fusion {

std::string encode_wire_header(const wire_header& h) {
  pb::wire_header m;
  m.set_version(h.version);
  m.set_dir(h.dir == wire_direction::forward    ? pb::wire_header::FORWARD
            : h.dir == wire_direction::backward ? pb::wire_header::BACKWARD
                                                : pb::wire_header::REDUCE);
  m.set_edge(h.edge);
  m.set_step(h.step);
  m.set_micro_batch(h.micro_batch);
  m.set_slot(h.slot);
  m.set_mode(h.mode);
  m.set_dtype(static_cast<uint32_t>(h.type));
  for (auto d : h.shape) m.add_shape(d);
  m.set_total_bytes(h.total_bytes);
  m.set_offset(h.offset);
  m.set_chunk_bytes(h.chunk_bytes);
  m.set_encoding(static_cast<uint32_t>(h.encoding));
  m.set_payload_bytes(h.wire_bytes());
  return m.SerializeAsString();
}

result<wire_header> decode_wire_header(std::string_view bytes, uint64_t payload_bytes) {
  pb::wire_header m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return fail("unreadable wire header (" + std::to_string(bytes.size()) + " bytes)");
  if (m.version() != wire_protocol_version)
    return fail("wire protocol version " + std::to_string(m.version()) + ", this node speaks " +
                std::to_string(wire_protocol_version));
  if (m.dir() != pb::wire_header::FORWARD && m.dir() != pb::wire_header::BACKWARD && m.dir() != pb::wire_header::REDUCE)
    return fail("wire header without a direction (forward, backward or reduce)");
  if (m.dtype() > static_cast<uint32_t>(dtype::f64)) return fail("unknown dtype " + std::to_string(m.dtype()));
  if (m.mode() > 255) return fail("unknown pass mode " + std::to_string(m.mode()));
  wire_header h;
  h.version = m.version();
  h.dir = m.dir() == pb::wire_header::FORWARD    ? wire_direction::forward
          : m.dir() == pb::wire_header::BACKWARD ? wire_direction::backward
                                                 : wire_direction::reduce;
  h.edge = m.edge();
  h.step = m.step();
  h.micro_batch = m.micro_batch();
  h.slot = m.slot();
  h.mode = static_cast<uint8_t>(m.mode());
  h.type = static_cast<dtype>(m.dtype());
  h.shape.assign(m.shape().begin(), m.shape().end());
  h.total_bytes = m.total_bytes();
  h.offset = m.offset();
  h.chunk_bytes = m.chunk_bytes();
  const codec* wire_codec = codec_on_wire(m.encoding());
  if (!wire_codec) return fail("unknown encoding " + std::to_string(m.encoding()) + " (" + wire_encoding_names() + ")");
  h.encoding = wire_codec->kind();
  h.payload_bytes = m.payload_bytes();
  // The shape's byte size, computed without overflow.
  uint64_t need = dtype_size(h.type);
  for (auto d : h.shape) {
    if (d < 0) return fail("negative dimension in shape " + to_string(h.shape));
    if (d > 0 && need > wire_max_tensor_bytes / static_cast<uint64_t>(d))
      return fail("shape " + to_string(h.shape) + " is larger than the " + std::to_string(wire_max_tensor_bytes >> 30) +
                  " GiB limit");
    need *= static_cast<uint64_t>(d);
  }
  if (need != h.total_bytes)
    return fail("shape " + to_string(h.shape) + " of " + to_string(h.type) + " needs " + std::to_string(need) +
                " bytes, header says " + std::to_string(h.total_bytes));
  if (h.encoding == codec_kind::none && h.payload_bytes != h.total_bytes)
    return fail("raw payload of " + std::to_string(h.payload_bytes) + " bytes for a " + std::to_string(h.total_bytes) +
                "-byte tensor");
  if (h.encoding != codec_kind::none) {
    // Bounded before anything is allocated: the codec says what its payloads can measure.
    if (h.type != dtype::f32)
      return fail(wire_codec->name() + " payload for a " + to_string(h.type) + " tensor (only f32 is compressed)");
    const uint64_t n = h.total_bytes / sizeof(float);
    const payload_range limits = wire_codec->payload_limits(n);
    if (h.payload_bytes < limits.min || h.payload_bytes > limits.max)
      return fail(wire_codec->name() + " payload of " + std::to_string(h.payload_bytes) + " bytes for " +
                  std::to_string(n) + " elements (at most " + std::to_string(limits.max) + ")");
  }
  const uint64_t wire = h.wire_bytes();
  if (h.offset > wire || h.chunk_bytes > wire - h.offset)
    return fail("chunk at offset " + std::to_string(h.offset) + " of " + std::to_string(h.chunk_bytes) +
                " bytes lies outside the " + std::to_string(wire) + "-byte payload");
  // Only an empty payload travels as an empty chunk: any other carries nothing and would earn
  // its edge a flow-control credit all the same.
  if (h.chunk_bytes == 0 && wire > 0)
    return fail("empty chunk at offset " + std::to_string(h.offset) + " of a " + std::to_string(wire) +
                "-byte payload");
  if (payload_bytes != h.chunk_bytes)
    return fail(std::string(payload_bytes < h.chunk_bytes ? "truncated" : "oversized") +
                " payload: header announces " + std::to_string(h.chunk_bytes) + " bytes, " +
                std::to_string(payload_bytes) + " arrived");
  return h;
}

std::vector<wire_header> split_into_chunks(const wire_header& base, uint64_t chunk_limit) {
  std::vector<wire_header> out;
  chunk_limit = std::max<uint64_t>(chunk_limit, 1);
  uint64_t off = 0;
  do {
    wire_header h = base;
    h.offset = off;
    h.chunk_bytes = std::min(chunk_limit, base.wire_bytes() - off);
    off += h.chunk_bytes;
    out.push_back(std::move(h));
  } while (off < base.wire_bytes());
  return out;
}

size_t wire_assembler::drop_edge(uint64_t edge) {
  const auto from = partial_.lower_bound(key_t{edge, 0, 0, 0});
  const auto to = partial_.lower_bound(key_t{edge + 1, 0, 0, 0});
  const auto n = static_cast<size_t>(std::distance(from, to));
  partial_.erase(from, to);
  return n;
}

std::vector<uint64_t> wire_assembler::partial_edges() const {
  std::vector<uint64_t> out;
  for (const auto& [key, p] : partial_)
    if (out.empty() || out.back() != std::get<0>(key)) out.push_back(std::get<0>(key));
  return out;
}

result<std::byte*> wire_assembler::begin_chunk(const wire_header& h) {
  key_t key{h.edge, static_cast<uint8_t>(h.dir), h.step, h.micro_batch};
  auto it = partial_.find(key);
  if (it == partial_.end()) {
    if (partial_.size() >= wire_max_partial_tensors)
      return fail("chunk of edge " + std::to_string(h.edge) + " micro-batch " + std::to_string(h.micro_batch) +
                  " would open a partly received tensor beyond the " + std::to_string(wire_max_partial_tensors) +
                  " one sender may have at once");
    partial p;
    p.shape = h.shape;
    p.type = h.type;
    p.encoding = h.encoding;
    try {
      // Neither is zeroed: a header alone must not commit the memory it announces.
      if (h.encoding == codec_kind::none) {
        p.value = tensor::uninitialized(h.shape, h.type);
      } else {
        p.payload.reset(new std::byte[h.payload_bytes]);
        p.payload_bytes = h.payload_bytes;
      }
    } catch (const std::bad_alloc&) {
      return fail("chunk of edge " + std::to_string(h.edge) + " micro-batch " + std::to_string(h.micro_batch) +
                  ": no memory for its " + std::to_string(h.wire_bytes()) + "-byte payload");
    }
    it = partial_.emplace(key, std::move(p)).first;
  }
  auto& p = it->second;
  if (p.shape != h.shape || p.type != h.type || p.encoding != h.encoding ||
      (h.encoding != codec_kind::none && p.payload_bytes != h.payload_bytes)) {
    return fail("chunk of edge " + std::to_string(h.edge) + " micro-batch " + std::to_string(h.micro_batch) +
                " has shape " + to_string(h.shape) + " (" + to_string(h.encoding) + "), earlier chunks had " +
                to_string(p.shape) + " (" + to_string(p.encoding) + ")");
  }
  const std::string which = "chunk at offset " + std::to_string(h.offset) + " of edge " + std::to_string(h.edge) +
                           " micro-batch " + std::to_string(h.micro_batch);
  if (p.chunks.count(h.offset)) return fail(which + " arrived twice");
  // Completion counts bytes, so an overlap would complete the tensor with a hole of uninitialized
  // memory in it (found by tests/fuzz/fuzz_wire.cpp).
  const uint64_t end = h.offset + h.chunk_bytes;
  auto next = p.chunks.lower_bound(h.offset);
  auto overlapping = next != p.chunks.end() && next->first < end ? next : p.chunks.end();
  if (next != p.chunks.begin() && std::prev(next)->second > h.offset) overlapping = std::prev(next);
  if (overlapping != p.chunks.end()) {
    return fail(which + " (" + std::to_string(h.chunk_bytes) + " bytes) overlaps the chunk at offset " +
                std::to_string(overlapping->first) + " (" + std::to_string(overlapping->second - overlapping->first) +
                " bytes)");
  }
  p.chunks.emplace(h.offset, end);
  std::byte* dst = nullptr;
  if (h.encoding != codec_kind::none) {
    if (p.payload_bytes > 0) dst = p.payload.get() + h.offset;
  } else if (!p.value.empty()) {
    dst = p.value.bytes() + h.offset;
  }
  return dst;
}

result<std::optional<tensor>> wire_assembler::end_chunk(const wire_header& h) {
  key_t key{h.edge, static_cast<uint8_t>(h.dir), h.step, h.micro_batch};
  auto it = partial_.find(key);
  if (it == partial_.end()) return std::optional<tensor>();
  it->second.received += h.chunk_bytes;
  if (it->second.received < h.wire_bytes()) return std::optional<tensor>();
  partial p = std::move(it->second);
  partial_.erase(it);
  if (p.encoding == codec_kind::none) return std::optional<tensor>(std::move(p.value));
  // Decoded straight into the tensor the consumer gets.
  tensor out = tensor::uninitialized(p.shape, p.type);
  const codec* wire_codec = codec_on_wire(static_cast<uint32_t>(p.encoding));  // validated with the header
  if (auto decoded = wire_codec->decode(std::span<const std::byte>(p.payload.get(), p.payload_bytes),
                                        std::span<float>(out.data<float>(), out.numel()));
      !decoded)
    return fail("edge " + std::to_string(h.edge) + " micro-batch " + std::to_string(h.micro_batch) + ": " +
                decoded.error());
  return std::optional<tensor>(std::move(out));
}

}  // namespace fusion
