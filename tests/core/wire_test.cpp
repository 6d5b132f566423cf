// The wire header codec: round trips, every validation error, chunking and reassembly.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include "compression/quant.hpp"
#include "compression/topk.hpp"
#include "core/wire.hpp"

using namespace fusion;

namespace {

wire_header sample_header() {
  wire_header h;
  h.dir = wire_direction::backward;
  h.edge = 42;
  h.step = 7;
  h.micro_batch = 3;
  h.slot = 1;
  h.mode = 0;
  h.type = dtype::f32;
  h.shape = {2, 3, 4};
  h.total_bytes = 96;
  h.chunk_bytes = 96;
  return h;
}

std::string decode_error(const wire_header& h, uint64_t payload) {
  return decode_wire_header(encode_wire_header(h), payload).error();
}

}  // namespace

TEST_CASE("wire: a header survives encoding") {
  wire_header h = sample_header();
  auto out = decode_wire_header(encode_wire_header(h), 96);
  REQUIRE(out.ok());
  CHECK(out->dir == wire_direction::backward);
  CHECK(out->edge == 42);
  CHECK(out->step == 7);
  CHECK(out->micro_batch == 3);
  CHECK(out->slot == 1);
  CHECK(out->shape == shape_t{2, 3, 4});
  CHECK(out->total_bytes == 96);
  // Every direction, the gradient ring's included (its micro-batch field is the ring step).
  for (auto dir : {wire_direction::forward, wire_direction::backward, wire_direction::reduce}) {
    h.dir = dir;
    auto again = decode_wire_header(encode_wire_header(h), 96);
    REQUIRE(again.ok());
    CHECK(again->dir == dir);
  }
}

TEST_CASE("wire: every malformed header is refused with a message that says why") {
  auto h = sample_header();
  h.version = wire_protocol_version + 1;
  CHECK(decode_error(h, 96).find("wire protocol version " + std::to_string(wire_protocol_version + 1) +
                                 ", this node speaks " + std::to_string(wire_protocol_version)) != std::string::npos);
  h = sample_header();
  h.total_bytes = h.chunk_bytes = 90;
  CHECK(decode_error(h, 90).find("needs 96 bytes, header says 90") != std::string::npos);
  h = sample_header();
  CHECK(decode_error(h, 50).find("truncated payload: header announces 96 bytes, 50 arrived") != std::string::npos);
  CHECK(decode_error(h, 100).find("oversized payload") != std::string::npos);
  h.offset = 64;
  h.chunk_bytes = 64;
  CHECK(decode_error(h, 64).find("outside the 96-byte payload") != std::string::npos);
  h = sample_header();
  h.shape = {-1, 4};
  CHECK(decode_error(h, 96).find("negative dimension") != std::string::npos);
  h.shape = {int64_t{1} << 40, int64_t{1} << 20};
  CHECK(decode_error(h, 96).find("GiB limit") != std::string::npos);
  h = sample_header();
  h.offset = 32;
  h.chunk_bytes = 0;  // would earn its edge a credit for nothing
  CHECK(decode_error(h, 0).find("empty chunk at offset 32 of a 96-byte payload") != std::string::npos);
  h.shape = {0, 3};
  h.total_bytes = h.offset = 0;
  CHECK(decode_wire_header(encode_wire_header(h), 0).ok());  // an empty tensor's one chunk
  h = sample_header();
  h.type = static_cast<dtype>(9);
  CHECK(decode_error(h, 96).find("unknown dtype 9") != std::string::npos);
  CHECK(decode_wire_header("\xff\xff\xff", 0).error().find("unreadable wire header") != std::string::npos);
}

TEST_CASE("wire: chunks cover the tensor and reassemble in any order") {
  auto base = sample_header();
  auto chunks = split_into_chunks(base, 40);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].offset == 0);
  CHECK(chunks[2].offset == 80);
  CHECK(chunks[2].chunk_bytes == 16);
  std::vector<std::byte> src(96);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
  wire_assembler asm_;
  std::optional<tensor> whole;
  for (int i : {2, 0, 1}) {
    auto dst = asm_.begin_chunk(chunks[i]);
    REQUIRE(dst);
    std::memcpy(*dst, src.data() + chunks[i].offset, chunks[i].chunk_bytes);
    auto done = asm_.end_chunk(chunks[i]);
    REQUIRE(done);
    whole = std::move(*done);
    CHECK(whole.has_value() == (i == 1));
  }
  REQUIRE(whole);
  CHECK(std::memcmp(whole->bytes(), src.data(), 96) == 0);
  CHECK(asm_.partial_count() == 0);
}

TEST_CASE("wire: a repeated chunk or a chunk of another shape is refused") {
  auto chunks = split_into_chunks(sample_header(), 48);
  wire_assembler asm_;
  REQUIRE(asm_.begin_chunk(chunks[0]));
  auto again = asm_.begin_chunk(chunks[0]);
  CHECK_FALSE(again);
  CHECK(again.error().find("arrived twice") != std::string::npos);
  auto other = chunks[1];
  other.shape = {96 / 4};
  auto reshaped = asm_.begin_chunk(other);
  CHECK_FALSE(reshaped);
  CHECK(reshaped.error().find("earlier chunks had [2, 3, 4]") != std::string::npos);
}

// Found by tests/fuzz/fuzz_wire.cpp (seed tests/fuzz/corpus/wire/overlap-hole): chunks at
// offsets 0, 80 and 128 of 64, 64 and 32 bytes add up to the 160 bytes of the tensor, which
// was then delivered with bytes 64..80 never written.
TEST_CASE("wire: a chunk overlapping an earlier one is refused, so no tensor completes with a hole") {
  wire_header base = sample_header();
  base.shape = {40};
  base.total_bytes = 160;
  auto chunk = [&](uint64_t offset, uint64_t bytes) {
    wire_header h = base;
    h.offset = offset;
    h.chunk_bytes = bytes;
    return h;
  };
  wire_assembler asm_;
  std::vector<std::byte> src(160, std::byte{1});
  auto deliver = [&](const wire_header& h) {
    auto dst = asm_.begin_chunk(h);
    REQUIRE(dst);
    std::memcpy(*dst, src.data() + h.offset, h.chunk_bytes);
    auto whole = asm_.end_chunk(h);
    REQUIRE(whole);
    return std::move(*whole);
  };
  CHECK_FALSE(deliver(chunk(0, 64)));
  CHECK_FALSE(deliver(chunk(80, 64)));
  auto refused = asm_.begin_chunk(chunk(128, 32));  // overlaps [80, 144)
  CHECK_FALSE(refused);
  CHECK(refused.error() ==
        "chunk at offset 128 of edge 42 micro-batch 3 (32 bytes) overlaps the chunk at offset 80 (64 bytes)");
  refused = asm_.begin_chunk(chunk(60, 8));  // overlaps [0, 64) from the right
  CHECK_FALSE(refused);
  CHECK(refused.error().find("overlaps the chunk at offset 0") != std::string::npos);
  refused = asm_.begin_chunk(chunk(64, 20));  // fills the hole and runs into [80, 144)
  CHECK_FALSE(refused);
  CHECK(refused.error().find("overlaps the chunk at offset 80") != std::string::npos);
  // The chunks that do fit complete the tensor, every byte written.
  CHECK_FALSE(deliver(chunk(64, 16)));
  auto whole = deliver(chunk(144, 16));
  REQUIRE(whole);
  CHECK(std::memcmp(whole->bytes(), src.data(), 160) == 0);
  CHECK(asm_.partial_count() == 0);
}

// ---- compressed edges (encoding topk) ------------------------------------------------------

namespace {

// A topk-encoded 2x3x64 tensor: the header of its one chunk, its payload and the dense values
// the receiver must reconstruct.
struct encoded_sample {
  wire_header h;
  std::vector<std::byte> payload;
  std::vector<float> expect;
};

encoded_sample encoded(double ratio) {
  encoded_sample s;
  std::vector<float> x(2 * 3 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  encode_topk(x, ratio, value_type::f32, 64, s.payload);
  s.expect.assign(x.size(), 0.0f);
  REQUIRE(decode_topk(s.payload, s.expect).ok());
  s.h = sample_header();
  s.h.shape = {2, 3, 64};
  s.h.total_bytes = x.size() * 4;
  s.h.encoding = codec_kind::topk;
  s.h.payload_bytes = s.payload.size();
  s.h.chunk_bytes = s.payload.size();
  return s;
}

}  // namespace

TEST_CASE("wire: a topk header survives encoding and its payload size is bounded") {
  auto s = encoded(0.1);
  auto out = decode_wire_header(encode_wire_header(s.h), s.payload.size());
  REQUIRE(out.ok());
  CHECK(out->encoding == codec_kind::topk);
  CHECK(out->payload_bytes == s.payload.size());
  CHECK(out->wire_bytes() == s.payload.size());
  CHECK(out->total_bytes == 2 * 3 * 64 * 4);

  wire_header h = s.h;
  h.payload_bytes = h.chunk_bytes = topk_max_payload_bytes(2 * 3 * 64) + 1;  // more than any topk payload
  CHECK(decode_error(h, h.chunk_bytes).find("topk payload of") != std::string::npos);
  h = s.h;
  h.payload_bytes = h.chunk_bytes = 8;  // shorter than a payload header
  CHECK(decode_error(h, 8).find("topk payload of 8 bytes") != std::string::npos);
  h = s.h;
  h.type = dtype::i32;
  CHECK(decode_error(h, h.chunk_bytes).find("only f32 is compressed") != std::string::npos);
  h = sample_header();
  h.payload_bytes = 50;  // a raw payload must be the tensor itself: the field is ignored when sent
  auto raw = decode_wire_header(encode_wire_header(h), 96);
  REQUIRE(raw.ok());
  CHECK(raw->payload_bytes == 96);
}

TEST_CASE("wire: an unknown encoding is refused") {
  // Encoding 2 (adatopk) never travels: adatopk sends topk payloads.
  wire_header h = sample_header();
  h.encoding = codec_kind::adatopk;
  CHECK(decode_error(h, 96).find("unknown encoding 2") != std::string::npos);
}

TEST_CASE("wire: chunks of a topk payload reassemble and decode into the dense tensor") {
  auto s = encoded(0.25);
  const auto chunks = split_into_chunks(s.h, 40);
  REQUIRE(chunks.size() == (s.payload.size() + 39) / 40);
  wire_assembler a;
  std::optional<tensor> whole;
  // Last chunk first: order does not matter.
  for (size_t k = chunks.size(); k-- > 0;) {
    const auto& c = chunks[k];
    auto h = decode_wire_header(encode_wire_header(c), c.chunk_bytes);
    REQUIRE(h.ok());
    auto dst = a.begin_chunk(*h);
    REQUIRE(dst);
    std::memcpy(*dst, s.payload.data() + h->offset, h->chunk_bytes);
    auto done = a.end_chunk(*h);
    CHECK(done.error().empty());
    REQUIRE(done);
    whole = std::move(*done);
    CHECK(whole.has_value() == (k == 0));
  }
  REQUIRE(whole);
  CHECK(whole->shape() == shape_t{2, 3, 64});
  CHECK(std::memcmp(whole->f32(), s.expect.data(), s.expect.size() * 4) == 0);
  CHECK(a.partial_count() == 0);
}

TEST_CASE("wire: a topk payload that does not decode is refused, not delivered") {
  auto s = encoded(0.1);
  s.payload[0] = std::byte{'X'};  // the magic
  wire_assembler a;
  auto h = decode_wire_header(encode_wire_header(s.h), s.payload.size());
  REQUIRE(h.ok());
  auto dst = a.begin_chunk(*h);
  REQUIRE(dst);
  std::memcpy(*dst, s.payload.data(), s.payload.size());
  auto whole = a.end_chunk(*h);
  CHECK_FALSE(whole);
  CHECK(whole.error().find("edge 42 micro-batch 3") != std::string::npos);
  CHECK(a.partial_count() == 0);
}

TEST_CASE("wire: int8 and int4 payloads travel under their own encodings and decode into the tensor") {
  std::vector<float> x(2 * 3 * 101);  // 606 elements: blocks of 64 and a partial one
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 7.0f - 7.0f;
  for (const codec_kind kind : {codec_kind::int8, codec_kind::int4}) {
    CAPTURE(to_string(kind));
    // What an edge sender does: the settings from the codec table, the payload from its encoder,
    // the header's encoding from the codec.
    const codec& c = codec_of(kind);
    edge_encoder sender(c.at(1.0, codec_settings{}));
    REQUIRE(sender.encodes(x.size()));
    std::vector<std::byte> payload;
    sender.encode(x, 0, payload);
    std::vector<float> expect(x.size());
    REQUIRE(decode_quant(payload, expect).ok());
    wire_header base = sample_header();
    base.shape = {2, 3, 101};
    base.total_bytes = x.size() * 4;
    base.encoding = c.wire_encoding();
    base.payload_bytes = base.chunk_bytes = payload.size();
    wire_assembler a;
    std::optional<tensor> whole;
    for (const auto& chunk : split_into_chunks(base, 100)) {
      auto h = decode_wire_header(encode_wire_header(chunk), chunk.chunk_bytes);
      REQUIRE(h.ok());
      CHECK(h->encoding == kind);
      auto dst = a.begin_chunk(*h);
      REQUIRE(dst);
      std::memcpy(*dst, payload.data() + h->offset, h->chunk_bytes);
      auto done = a.end_chunk(*h);
      REQUIRE(done);
      if (done->has_value()) whole = std::move(*done);
    }
    REQUIRE(whole);
    CHECK(std::memcmp(whole->f32(), expect.data(), expect.size() * 4) == 0);
    // A damaged scale is refused by name, and nothing is delivered.
    std::memcpy(payload.data() + quant_header_bytes + 4, &x[0], 4);  // -7: a negative scale
    auto h = decode_wire_header(encode_wire_header(base), payload.size());
    REQUIRE(h.ok());
    auto dst = a.begin_chunk(*h);
    REQUIRE(dst);
    std::memcpy(*dst, payload.data(), payload.size());
    auto refused = a.end_chunk(*h);
    CHECK_FALSE(refused);
    CHECK(refused.error().find("edge 42 micro-batch 3: " + to_string(kind) +
                               " payload: the scale of block 1 is negative") != std::string::npos);
    // More bytes than any payload of the codec for this tensor: refused before allocating.
    base.payload_bytes = base.chunk_bytes = c.payload_limits(x.size()).max + 1;
    CHECK(decode_error(base, base.chunk_bytes).find(to_string(kind) + " payload of") != std::string::npos);
  }
}

namespace {

// Resident memory of this process (Linux /proc/self/statm), in bytes.
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("wire: a chunk announcing a large encoded tensor takes no memory before its bytes come") {
  // 2^26 floats in topk: a payload of up to 470 MB announced by a 16-byte first chunk, which a
  // broken or hostile sender may follow with nothing (and then with the next micro-batch's).
  wire_header h = sample_header();
  h.shape = {int64_t{1} << 26};
  h.total_bytes = uint64_t{4} << 26;
  h.encoding = codec_kind::topk;
  h.payload_bytes = topk_max_payload_bytes(uint64_t{1} << 26);
  h.chunk_bytes = 16;
  auto decoded = decode_wire_header(encode_wire_header(h), 16);
  REQUIRE(decoded.ok());
  wire_assembler a;
  const uint64_t before = resident_bytes();
  auto dst = a.begin_chunk(*decoded);
  REQUIRE(dst);
  std::memset(*dst, 0, 16);
  CHECK(a.end_chunk(*decoded));
  CHECK(a.partial_count() == 1);
  // Zero-filled, as before, the reservation was resident at once.
  CHECK(resident_bytes() - std::min(before, resident_bytes()) < (uint64_t{64} << 20));
}

TEST_CASE("wire: one assembler holds at most wire_max_partial_tensors partly received tensors") {
  wire_assembler a;
  wire_header h = sample_header();
  h.chunk_bytes = 8;  // of 96: every tensor stays partial
  for (size_t mb = 0; mb < wire_max_partial_tensors; ++mb) {
    h.micro_batch = static_cast<uint32_t>(mb);
    REQUIRE(a.begin_chunk(h));
  }
  CHECK(a.partial_count() == wire_max_partial_tensors);
  h.micro_batch = static_cast<uint32_t>(wire_max_partial_tensors);
  auto refused = a.begin_chunk(h);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().find("beyond the 4096 one sender may have at once") != std::string::npos);
  // A chunk of a tensor already begun still has its place.
  h.micro_batch = 0;
  h.offset = 8;
  CHECK(a.begin_chunk(h));
}

TEST_CASE("wire: dropping an edge forgets its partly received tensors and only those") {
  wire_assembler a;
  wire_header h = sample_header();
  h.chunk_bytes = 8;  // of 96: every tensor stays partial
  for (uint64_t edge : {6, 7, 8})
    for (uint32_t mb : {0u, 1u}) {
      h.edge = edge;
      h.micro_batch = mb;
      REQUIRE(a.begin_chunk(h));
    }
  CHECK(a.partial_edges() == std::vector<uint64_t>{6, 7, 8});
  CHECK(a.drop_edge(7) == 2);
  CHECK(a.drop_edge(7) == 0);
  CHECK(a.partial_count() == 4);
  CHECK(a.partial_edges() == std::vector<uint64_t>{6, 8});
  // Edge 7's first chunk is new again; edge 6's still counts as received.
  h.edge = 7;
  h.micro_batch = 0;
  CHECK(a.begin_chunk(h));
  h.edge = 6;
  auto again = a.begin_chunk(h);
  REQUIRE_FALSE(again);
  CHECK(again.error().find("arrived twice") != std::string::npos);
}
