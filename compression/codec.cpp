// The codec table (compression/codec_list.hpp), the names, the dense codec and the sender's
// edge_encoder. The codecs themselves live in their own files (compression/topk.cpp).
#include "compression/codec.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>

namespace fusion {

// Each codec's accessor, defined next to the codec.
#define FUSION_CODEC(name, id, accessor) const codec& accessor();
#include "compression/codec_list.hpp"
#undef FUSION_CODEC

namespace {

constexpr codec_kind kinds[] = {
#define FUSION_CODEC(name, id, accessor) codec_kind::name,
#include "compression/codec_list.hpp"
#undef FUSION_CODEC
};
constexpr size_t codec_count = std::size(kinds);

// The table, indexed like `kinds`. Built on first use: the codecs are function-local statics
// of other translation units.
const std::array<const codec*, codec_count>& table() {
  static const std::array<const codec*, codec_count> t = {
#define FUSION_CODEC(name, id, accessor) &accessor(),
#include "compression/codec_list.hpp"
#undef FUSION_CODEC
  };
  return t;
}

constexpr value_type all_value_types[] = {value_type::f32, value_type::f16, value_type::bf16, value_type::int8};

// "a, b or c"
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// The raw fp32 bytes. The wire sends a raw tensor as itself (encodes() is false), so encode and
// decode only serve the table's uniform tests and any caller that wants a payload regardless.
class dense_codec_impl final : public codec {
 public:
  codec_kind kind() const override { return codec_kind::none; }
  codec_settings at(double, const codec_settings&) const override { return {}; }
  bool encodes(uint64_t, const codec_settings&) const override { return false; }
  uint64_t payload_bytes(uint64_t n, const codec_settings&) const override { return n * sizeof(float); }
  payload_range payload_limits(uint64_t n) const override { return {n * sizeof(float), n * sizeof(float)}; }
  void encode(std::span<const float> x, const codec_settings&, std::vector<std::byte>& out) const override {
    out.resize(x.size_bytes());
    if (!x.empty()) std::memcpy(out.data(), x.data(), x.size_bytes());
  }
  status decode(std::span<const std::byte> payload, std::span<float> dst) const override {
    if (payload.size() != dst.size_bytes())
      return fail("raw payload: " + std::to_string(payload.size()) + " bytes for " + std::to_string(dst.size()) +
                  " floats (" + std::to_string(dst.size_bytes()) + " bytes)");
    if (!dst.empty()) std::memcpy(dst.data(), payload.data(), payload.size());
    return {};
  }
  std::vector<codec_settings> examples() const override { return {codec_settings{}}; }
  double error_bound(const codec_settings&) const override { return 0; }
};

}  // namespace

const codec& dense_codec() {
  static const dense_codec_impl c;
  return c;
}

std::string to_string(codec_kind k) {
  switch (k) {
#define FUSION_CODEC(name, id, accessor) \
  case codec_kind::name:                 \
    return #name;
#include "compression/codec_list.hpp"
#undef FUSION_CODEC
  }
  return "codec(" + std::to_string(static_cast<int>(k)) + ")";
}

std::string to_string(value_type v) {
  switch (v) {
    case value_type::f32: return "f32";
    case value_type::f16: return "f16";
    case value_type::bf16: return "bf16";
    case value_type::int8: return "int8";
  }
  return "value_type(" + std::to_string(static_cast<int>(v)) + ")";
}

bool parse_codec_kind(std::string_view text, codec_kind& out) {
  for (auto k : kinds)
    if (text == to_string(k)) return out = k, true;
  return false;
}

bool parse_value_type(std::string_view text, value_type& out) {
  for (auto v : all_value_types)
    if (text == to_string(v)) return out = v, true;
  return false;
}

std::string codec_names() {
  std::vector<std::string> names;
  for (auto k : kinds) names.push_back(to_string(k));
  return name_list(names);
}

std::string value_type_names() {
  std::vector<std::string> names;
  for (auto v : all_value_types) names.push_back(to_string(v));
  return name_list(names);
}

uint64_t codec::wire_bytes(uint64_t n, const codec_settings& s) const {
  return encodes(n, s) ? payload_bytes(n, s) : n * sizeof(float);
}

const codec& codec_of(codec_kind kind) {
  for (size_t i = 0; i < codec_count; ++i)
    if (kinds[i] == kind) return *table()[i];
  throw std::invalid_argument("no codec of kind " + std::to_string(static_cast<int>(kind)) + " in this build (" +
                              codec_names() + ")");
}

const codec* codec_on_wire(uint32_t encoding) {
  for (const codec* c : table())
    if (static_cast<uint32_t>(c->kind()) == encoding && c->wire_encoding() == c->kind()) return c;
  return nullptr;
}

std::span<const codec* const> all_codecs() { return table(); }

std::string wire_encoding_names() {
  std::string out;
  for (const codec* c : table()) {
    if (c->wire_encoding() != c->kind()) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(static_cast<int>(c->kind())) + " " +
           (c->kind() == codec_kind::none ? std::string("raw") : c->name());
  }
  return out;
}

void edge_encoder::set(const codec_settings& s) {
  if (!s.error_feedback || s.kind != settings_.kind) residual_.clear();
  settings_ = s;
}

bool edge_encoder::encodes(uint64_t n) const { return codec_of(settings_.kind).encodes(n, settings_); }

void edge_encoder::encode(std::span<const float> x, uint32_t slot, std::vector<std::byte>& out) {
  const codec_settings& s = settings_;
  if (s.kind == codec_kind::none) throw std::invalid_argument("edge_encoder: kind none sends the raw tensor");
  const codec& c = codec_of(s.kind);
  if (!s.error_feedback) {
    c.encode(x, s, out);
    return;
  }
  if (residual_.size() <= slot) residual_.resize(size_t{slot} + 1);
  std::vector<float>& r = residual_[slot];
  if (r.size() != x.size()) r.assign(x.size(), 0.0f);  // a new shape starts without history
  for (size_t i = 0; i < x.size(); ++i) r[i] += x[i];   // r = x' = x + r
  c.encode(r, s, out);
  // r = x' - decoded(x'): what the receiver does not reconstruct (dropped elements, rounding).
  decoded_.resize(r.size());
  if (auto decoded = c.decode(out, decoded_); !decoded)
    throw std::logic_error("edge_encoder: our own " + c.name() + " payload does not decode: " + decoded.error());
  for (size_t i = 0; i < r.size(); ++i) r[i] -= decoded_[i];
  // inf - inf, NaN, an overflow to inf in fp16: a residual that is not finite would poison
  // every later step of this slot, so it is dropped.
  for (float& v : r) v = std::isfinite(v) ? v : 0.0f;
}

}  // namespace fusion
