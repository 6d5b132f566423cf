// Fuzzes the frame channel's preamble parser (net/frame_channel.hpp decode_preamble): magic,
// version, flags, reserved bytes and the meta and payload limits, over a stream of frames as a
// frame_server reader sees it (preamble, meta, payload, next preamble).
//
// Beyond sanitizer findings it checks that an accepted preamble is within the limits it was
// decoded against and encodes back to exactly the 20 bytes it came from (nothing is ignored),
// and that the meta of a reverse hello (connection reversal) decodes only when it re-encodes to
// the same bytes, within max_reverse_meta.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "net/frame_channel.hpp"

namespace fn = fusion::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the limits: the defaults, or the small ones a test server might use.
  if (size < 1) return 0;
  const bool small = data[0] & 1;
  const uint32_t max_meta = small ? 64 : fn::max_meta_bytes;
  const uint64_t max_payload = small ? 4096 : fn::max_payload_bytes;
  const auto* p = reinterpret_cast<const std::byte*>(data + 1);
  size_t left = size - 1;
  while (left >= fn::preamble_size) {
    auto pre = fn::decode_preamble(p, max_meta, max_payload);
    if (!pre) {
      if (pre.error().empty()) std::abort();  // a refusal must say why
      return 0;
    }
    if (pre->meta_size > max_meta || pre->payload_size > max_payload) std::abort();
    std::byte again[fn::preamble_size];
    fn::encode_preamble(*pre, again);
    if (std::memcmp(again, p, fn::preamble_size) != 0) std::abort();
    p += fn::preamble_size;
    left -= fn::preamble_size;
    // The reader takes meta and payload off the stream next; a short stream ends the connection.
    const uint64_t body = uint64_t{pre->meta_size} + pre->payload_size;
    if (body > left) return 0;
    if (pre->flags & fn::flag_reverse) {
      if (pre->flags != fn::flag_reverse || pre->payload_size != 0 || pre->meta_size > fn::max_reverse_meta)
        std::abort();
      std::string_view meta(reinterpret_cast<const char*>(p), pre->meta_size);
      auto hello = fn::decode_reverse_hello(meta);
      if (!hello && hello.error().empty()) std::abort();
      if (hello && (hello->node.empty() || hello->token.empty() || fn::encode_reverse_hello(*hello) != meta))
        std::abort();
    }
    p += body;
    left -= static_cast<size_t>(body);
  }
  return 0;
}
