// codec_for_edge (scheduler/compression_plan.hpp): the one decision of an edge's codec that
// planning, AdaTopK, migration and the admin's `compress` share.
#include <doctest/doctest.h>

#include "compression/codec.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/plan.hpp"

namespace fusion {
namespace {

plan_edge edge(bool forward, bool compressible = true) {
  plan_edge e;
  e.id = 7;
  e.kind = forward ? edge_kind::forward : edge_kind::backward;
  e.from = 0;
  e.to = 1;
  e.bytes_per_micro_batch = 4 * 8192;
  e.compressible = compressible;
  return e;
}

compression_config config(codec_kind mode) {
  compression_config c;
  c.mode = mode;
  c.ratio = 0.2;
  c.error_feedback = true;
  c.adaptive.values = value_type::bf16;
  c.adaptive.block = 1024;
  return c;
}

}  // namespace

TEST_CASE("codec_for_edge: mode none and token ids stay raw") {
  CHECK(codec_for_edge(edge(true), config(codec_kind::none)) == codec_settings{});
  CHECK(codec_for_edge(edge(false), config(codec_kind::none), {0.1, std::nullopt}) == codec_settings{});
  for (auto mode : {codec_kind::topk, codec_kind::adatopk})
    CHECK(codec_for_edge(edge(true, false), config(mode), {0.1, pinned_codec{codec_kind::topk, 0.5}}) ==
          codec_settings{});
}

TEST_CASE("codec_for_edge: topk runs every edge at the run's ratio") {
  const auto c = config(codec_kind::topk);
  const codec_settings fwd = codec_for_edge(edge(true), c);
  CHECK(fwd.kind == codec_kind::topk);
  CHECK(fwd.keep_ratio == 0.2);
  CHECK(fwd.values == value_type::bf16);
  CHECK(fwd.block == 1024);
  CHECK_FALSE(fwd.error_feedback);  // activations never carry a residual
  CHECK(codec_for_edge(edge(false), c).error_feedback);
  // A link ratio is AdaTopK's: a fixed-ratio run ignores it.
  CHECK(codec_for_edge(edge(true), c, {0.05, std::nullopt}) == fwd);
  // topk at ratio 1 keeps every element with the values rounded (raw would be mode none).
  auto all = c;
  all.ratio = 1;
  const codec_settings keep_all = codec_for_edge(edge(true), all);
  CHECK(keep_all.keep_ratio < 1);
  CHECK(wire_bytes_per_micro_batch([&] {
          plan_edge e = edge(true);
          e.setting = keep_all;
          return e;
        }()) < edge(true).bytes_per_micro_batch);
}

TEST_CASE("codec_for_edge: adatopk follows its link's ratio and starts dense") {
  const auto c = config(codec_kind::adatopk);
  const codec_settings fresh = codec_for_edge(edge(true), c);
  CHECK(fresh.kind == codec_kind::adatopk);
  CHECK(fresh.keep_ratio == 1);  // no governor yet: raw fp32 until measured
  CHECK(codec_text(fresh) == "adatopk dense");
  const codec_settings governed = codec_for_edge(edge(false), c, {0.3, std::nullopt});
  CHECK(governed.kind == codec_kind::adatopk);
  CHECK(governed.keep_ratio == 0.3);
  CHECK(governed.error_feedback);
  CHECK(codec_text(governed) == "adatopk 30% int8 /64 ef");  // the ladder's top-k rungs: int8 values
}

TEST_CASE("codec_for_edge: the admin's choice outranks the run's") {
  for (auto mode : {codec_kind::none, codec_kind::topk, codec_kind::adatopk}) {
    const auto c = config(mode);
    INFO(to_string(mode));
    // compress EDGE 0.1: topk at 0.1 with the run's value type and block, whatever the mode.
    const codec_settings pinned = codec_for_edge(edge(false), c, {0.5, pinned_codec{codec_kind::topk, 0.1}});
    CHECK(pinned.kind == codec_kind::topk);
    CHECK(pinned.keep_ratio == 0.1);
    CHECK(pinned.values == value_type::bf16);
    CHECK(pinned.block == 1024);
    CHECK(pinned.error_feedback);
    // compress EDGE 1: every element kept, values rounded.
    CHECK(codec_for_edge(edge(true), c, {std::nullopt, pinned_codec{codec_kind::topk, 1.0}}).keep_ratio < 1);
    // compress EDGE none: raw, even under a governor.
    CHECK(codec_for_edge(edge(true), c, {0.5, pinned_codec{}}) == codec_settings{});
  }
}

TEST_CASE("codec_for_edge: assign_codecs gives every edge what codec_for_edge decides") {
  plan p;
  p.edges = {edge(true), edge(false), edge(true, false)};
  for (auto mode : {codec_kind::none, codec_kind::topk, codec_kind::adatopk}) {
    const auto c = config(mode);
    assign_codecs(p, nullptr, c);  // no estimator: adatopk starts dense
    for (const auto& e : p.edges) CHECK(e.setting == codec_for_edge(e, c));
  }
}

}  // namespace fusion

namespace fusion {

TEST_CASE("codec_for_edge: a gradient ring hop follows train.allreduce, whatever the activations' codec") {
  plan_edge ring = edge(false, false);
  ring.kind = edge_kind::reduce;
  for (auto mode : {codec_kind::none, codec_kind::topk, codec_kind::adatopk, codec_kind::int8}) {
    compression_config c = config(mode);
    CHECK(codec_for_edge(ring, c) == codec_settings{});  // f32: raw
    CHECK(codec_for_edge(ring, c, {0.1, pinned_codec{codec_kind::topk, 0.5}}) == codec_settings{});
    c.allreduce = value_type::f16;
    const codec_settings f16 = codec_for_edge(ring, c, {0.1, std::nullopt});
    CHECK(f16.kind == codec_kind::topk);
    CHECK(f16.keep_ratio == keep_all_ratio);  // every element, values rounded to f16
    CHECK(f16.values == value_type::f16);
    CHECK_FALSE(f16.error_feedback);
    // Half the bytes of the f32 gradient chunk, and a few for the codec's header.
    ring.setting = f16;
    CHECK(wire_bytes_per_micro_batch(ring) < ring.bytes_per_micro_batch * 6 / 10);
  }
}

}  // namespace fusion
