// Fuzzes the receiving side of the wire format (core/wire.hpp): decode_wire_header (protobuf
// header validated against the payload that arrived) and wire_assembler, which writes chunks
// in place and decodes topk payloads (compression/topk.hpp) once a tensor is complete.
//
// Input: records of u16 LE header length, header bytes, u16 LE payload length, payload bytes,
// fed in order to one assembler, as a node's data channel does with its frames.
// Beyond sanitizer findings the target checks one invariant: a raw tensor is only handed out
// when every one of its bytes was written by some chunk (the consumer would read heap garbage).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/wire.hpp"

namespace {

// A receiver allocates the tensor its header announces, up to wire_max_tensor_bytes (16 GiB),
// once the edge is routed; that bound is the protocol's, so headers above this harness's memory
// limit are skipped instead of being reported as huge allocations.
constexpr uint64_t max_announced_bytes = uint64_t{64} << 20;

uint16_t take_u16(const uint8_t*& p, const uint8_t* end) {
  if (end - p < 2) return 0;
  uint16_t v = static_cast<uint16_t>(p[0] | (p[1] << 8));
  p += 2;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  fusion::wire_assembler assembler;
  // The byte ranges written into each raw tensor being assembled, by assembler key.
  std::map<std::tuple<uint64_t, int, uint64_t, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>> written;
  while (end - p >= 4) {
    size_t hlen = std::min<size_t>(take_u16(p, end), end - p);
    std::string_view header(reinterpret_cast<const char*>(p), hlen);
    p += hlen;
    size_t plen = std::min<size_t>(take_u16(p, end), end - p);
    const uint8_t* payload = p;
    p += plen;

    auto decoded = fusion::decode_wire_header(header, plen);
    if (!decoded) continue;
    const fusion::wire_header& h = *decoded;
    if (h.total_bytes > max_announced_bytes || h.payload_bytes > max_announced_bytes) continue;
    auto dst = assembler.begin_chunk(h);
    if (!dst) continue;
    if (plen > 0) {
      if (!*dst) std::abort();  // a chunk with bytes must have somewhere to go
      std::memcpy(*dst, payload, plen);
    }
    auto key = std::make_tuple(h.edge, static_cast<int>(h.dir), h.step, h.micro_batch);
    written[key].emplace_back(h.offset, h.offset + plen);
    auto done = assembler.end_chunk(h);
    auto whole = done ? std::move(*done) : std::nullopt;
    if (whole && h.encoding == fusion::codec_kind::none) {
      auto& ranges = written[key];
      std::sort(ranges.begin(), ranges.end());
      uint64_t covered = 0;  // length of the prefix [0, covered) the ranges fill without a hole
      for (auto [from, to] : ranges)
        if (from <= covered) covered = std::max(covered, to);
      if (covered != whole->nbytes()) {
        std::fprintf(stderr, "wire_assembler completed a %zu-byte tensor with only %llu bytes written\n",
                     whole->nbytes(), static_cast<unsigned long long>(covered));
        std::abort();
      }
    }
    if (whole || !done) written.erase(key);
  }
  return 0;
}
