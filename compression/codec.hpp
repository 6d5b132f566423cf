// Edge codecs: how one direction of a cross-node edge carries a float tensor. The interface
// every codec implements, the codec table, and the sender's per-edge state. Plain C++ (no CAF,
// no CUDA headers), tested directly (tests/compression/).
//
//   none    the raw fp32 bytes (the wire carries the tensor itself; no payload is built)
//   topk    magnitude top-k per block, values as f32, f16, bf16 or int8 (compression/topk.hpp has
//           the rules and the payload layout); at keep_all_ratio it keeps every element and
//           only rounds the values
//   adatopk topk on the wire; the scheduler sets the ratio per edge and direction
//           (compression/adaptive.hpp); its ladder's quantizing rungs are int8 and int4, its
//           top-k rungs send int8 values
//   int8    a signed 8-bit code per element and an f32 scale per block of scale_block elements
//   int4    the same with 4-bit codes, two per byte (compression/quant.hpp has both formats)
//
// Everything outside compression/ asks the table (codec_of, codec_on_wire) instead of knowing
// a codec's format: the wire validates and decodes through it, the planner and the estimator
// size edges through it, AdaTopK prices its ladder through it. Adding a codec: docs/compression.md,
// "How to add a codec".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.hpp"

namespace fusion {

/// Which codec an edge direction uses: one per line of compression/codec_list.hpp. The value is
/// also the wire header's encoding field for the codecs that travel under their own kind
/// (codec::wire_encoding), so it never changes.
enum class codec_kind : uint8_t {
#define FUSION_CODEC(name, id, accessor) name = id,
#include "compression/codec_list.hpp"
#undef FUSION_CODEC
};

/// Element type of the values a codec sends. int8: a code per value and an f32 scale per
/// codec_settings::scale_block values (topk only: compression/topk.hpp).
enum class value_type : uint8_t { f32 = 0, f16 = 1, bf16 = 2, int8 = 3 };

/// "none", "topk", "adatopk", "int8", "int4" / "f32", "f16", "bf16", "int8".
std::string to_string(codec_kind k);
std::string to_string(value_type v);
/// Parses a name; false when unknown.
bool parse_codec_kind(std::string_view text, codec_kind& out);
bool parse_value_type(std::string_view text, value_type& out);
/// The names for a usage message: "none, topk, adatopk, int8 or int4" / "f32, f16, bf16 or int8".
std::string codec_names();
std::string value_type_names();

/// Largest block any codec's payload may declare (topk's block-local indices are 16 bits).
inline constexpr uint32_t codec_max_block = 65536;

/// The settings of one codec instance (what compress_atom sends to an edge sender).
struct codec_settings {
  codec_kind kind = codec_kind::none;
  double keep_ratio = 1.0;           ///< (0, 1]; the codec's level (topk: fraction kept)
  value_type values = value_type::f16;
  uint32_t block = 4096;             ///< elements per block, 1..codec_max_block
  bool error_feedback = false;       ///< gradient direction only (edge_encoder)
  /// int8 / int4, and topk's int8 values: elements per scale, 1..codec_max_block
  /// (compression/quant.hpp's quant_default_block).
  uint32_t scale_block = 64;
  bool operator==(const codec_settings&) const = default;
};

/// Smallest and largest payload a codec accepts for a tensor (checked before allocating).
struct payload_range {
  uint64_t min = 0, max = 0;
};

/// One codec: sizes, encoder and decoder of its payloads on the CPU. Instances live in the
/// codec table (codec_of); they hold no state, so one serves every edge and thread.
class codec {
 public:
  virtual ~codec() = default;
  /// The table's key.
  virtual codec_kind kind() const = 0;
  /// The config and command-line name (to_string(kind())).
  std::string name() const { return to_string(kind()); }
  /// The encoding the wire header carries for this codec's payloads (adatopk sends topk); a
  /// receiver decodes with codec_on_wire(encoding).
  virtual codec_kind wire_encoding() const { return kind(); }
  /// Whether the scheduler sets this codec's level per link (AdaTopK), not the run's ratio.
  virtual bool adaptive() const { return false; }

  /// The settings of this codec at level `ratio` (the scheduler's keep ratio, or the admin's),
  /// with the run's value type, block and error feedback from `run`; kind none for none.
  virtual codec_settings at(double ratio, const codec_settings& run) const = 0;
  /// True when a tensor of `n` floats is sent encoded under `s` (false: its raw fp32 bytes
  /// travel, e.g. when the encoding would be no smaller).
  virtual bool encodes(uint64_t n, const codec_settings& s) const = 0;
  /// Exact bytes encode() writes for `n` floats under `s`.
  virtual uint64_t payload_bytes(uint64_t n, const codec_settings& s) const = 0;
  /// Bytes on the wire for `n` floats under `s`: the payload when encodes(), else 4n.
  uint64_t wire_bytes(uint64_t n, const codec_settings& s) const;
  /// The payload sizes decode() can accept for `n` elements, whatever the settings.
  virtual payload_range payload_limits(uint64_t n) const = 0;
  /// Encodes `x` into `out` (resized to payload_bytes). Throws std::invalid_argument on
  /// settings this codec does not accept.
  virtual void encode(std::span<const float> x, const codec_settings& s, std::vector<std::byte>& out) const = 0;
  /// Decodes `payload` into `dst` (its size must equal the payload's element count), validating
  /// all of it first; on an error fails saying what is wrong and leaves `dst` untouched.
  virtual status decode(std::span<const std::byte> payload, std::span<float> dst) const = 0;

  /// For plan tables and metrics: "none", "topk 10% f16", "adatopk dense", + " ef".
  virtual std::string describe(const codec_settings&) const { return name(); }
  /// Settings that exercise this codec (the table's tests run each; keep them varied).
  virtual std::vector<codec_settings> examples() const = 0;
  /// Upper bound of ||x - decode(encode(x))|| / ||x|| under `s` for finite x well inside the
  /// range of the value type (the table's tests check it).
  virtual double error_bound(const codec_settings& s) const = 0;
};

/// The codec of `kind`. Throws std::invalid_argument for a kind the table lacks.
const codec& codec_of(codec_kind kind);
/// The codec that decodes a wire header's encoding, or null for an encoding no codec sends.
const codec* codec_on_wire(uint32_t encoding);
/// Every codec of the table, in codec_kind order.
std::span<const codec* const> all_codecs();
/// "0 raw, 1 topk, 3 int8, 4 int4": the encodings a wire header may carry, for error messages.
std::string wire_encoding_names();

/// A GPU encoder of a codec: `n` floats at device pointer `x` into a host payload that equals
/// the CPU encoder's byte for byte. compression/codec_cuda.hpp says which codecs have one.
using device_encode_fn = void (*)(const float* x, uint64_t n, const codec_settings& s, std::vector<std::byte>& out);

/// The sending side of one edge direction: applies the settings, keeps the error-feedback
/// residual per micro-batch slot when enabled (x' = x + r; send encode(x'); r = x' - decoded).
class edge_encoder {
 public:
  explicit edge_encoder(codec_settings s = {}) : settings_(s) {}
  const codec_settings& settings() const { return settings_; }
  /// New settings; residuals are dropped when error feedback goes off or the kind changes.
  void set(const codec_settings& s);
  /// True when this tensor of `n` floats is sent encoded (codec::encodes); false means send it
  /// raw (ratio 1 is dense and exact, never rounded to f16).
  bool encodes(uint64_t n) const;
  /// Encodes `x` (micro-batch slot `slot`, for the residual) into `out`.
  void encode(std::span<const float> x, uint32_t slot, std::vector<std::byte>& out);

 private:
  codec_settings settings_;
  std::vector<std::vector<float>> residual_;  // by micro-batch slot
  std::vector<float> decoded_;                // scratch of the residual update
};

}  // namespace fusion
