// The codec table: one line per codec, FUSION_CODEC(name, id, accessor).
//   name      its codec_kind and its config / command-line name
//   id        the codec_kind's value, which is also the wire header's encoding for a codec that
//             travels under its own kind: never reuse or renumber one (nodes of different builds
//             read each other's headers)
//   accessor  `const codec& accessor()`, defined with the codec in compression/
// Included with FUSION_CODEC defined (compression/codec.hpp, compression/codec.cpp); adding a
// codec is its implementation in compression/ plus one line here (docs/compression.md).
// No include guard: every includer expands the list its own way.
FUSION_CODEC(none, 0, dense_codec)    // compression/codec.cpp
FUSION_CODEC(topk, 1, topk_codec)     // compression/topk.cpp
FUSION_CODEC(adatopk, 2, adatopk_codec)  // compression/topk.cpp
FUSION_CODEC(int8, 3, int8_codec)    // compression/quant.cpp
FUSION_CODEC(int4, 4, int4_codec)    // compression/quant.cpp
