// The OP-DAG: a validated, shape-inferred, topologically ordered graph of operator nodes,
// loaded from a protobuf text model file (schema: proto/graph.proto).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "tensor/tensor.hpp"
#include "ops/op.hpp"

namespace fusion {

/// A model-file error; what() reads "FILE:LINE: node 'NAME': message" (node part when known).
struct graph_error : error {
  using error::error;
};

/// Largest element count of any one tensor of a model: an input, a node's output or a parameter
/// (2^32, i.e. 16 GiB of f32: the largest tensor core/wire.hpp lets cross a process boundary).
/// The loader refuses a model that needs more, naming the file, line and node.
inline constexpr int64_t graph_max_tensor_elements = int64_t{1} << 32;

/// Largest number of learnable scalars in one model (2^36, about 68.7 billion: 1 TiB of f32
/// weights, gradients and Adam moments). The loader refuses a model with more.
inline constexpr int64_t graph_max_params = int64_t{1} << 36;

/// What a data source fills an input with (core/data_source.hpp): a text model is fed
/// {tokens, targets}, an image classifier {images, labels}.
struct graph_feed {
  std::string feed;   ///< "tokens", "targets", "images" or "labels"
  int node = -1;      ///< the input node
};

/// Whether `feed` is one of the feeds above.
bool graph_feed_known(const std::string& feed);

/// One consumer of a node's output: which node, and which of its input slots.
struct graph_edge_end {
  int node = -1;
  int slot = -1;
};

/// One node of the OP-DAG. Input nodes (data entry points) have no op.
struct graph_node {
  int id = -1;                  ///< index in graph::nodes (which is in topological order)
  std::string name;             ///< unique; repeated blocks give "h0.ln1", "h1.ln1", ...
  std::string kind;             ///< op kind, or "input"
  attr_map attrs;               ///< resolved attributes
  std::vector<int> inputs;      ///< producer node ids, one per input slot
  std::vector<graph_edge_end> consumers;  ///< every (node, slot) reading this node's output
  shape_t shape;                ///< output shape for the batch size the graph was loaded with
  dtype type = dtype::f32;      ///< output dtype
  std::unique_ptr<op> impl;     ///< null for inputs
  int line = 0;                 ///< line of the node in the model file
  /// An identity node the loader put between an op and its several consumers ("<op>.fan"): not
  /// in the model file; placement puts it with its consumers when they share a node.
  bool fanout = false;
  bool is_input() const { return kind == "input"; }
};

/// A loaded model.
struct graph {
  std::string name;             ///< model name from the file
  std::string file;             ///< path it was loaded from
  int64_t batch = 0;            ///< the B the shapes were inferred for
  int64_t context = 0;          ///< T: the sequence length of the token input (0: not a text model)
  int64_t vocab = 0;            ///< V: vocabulary size the model expects (0: not a text model)
  /// Items one row of a batch holds, for throughput: T tokens for a text model, 1 image.
  int64_t row_items = 1;
  std::vector<graph_node> nodes;  ///< topological order: producers before consumers
  /// The fed inputs in data-source order: {tokens, targets} or {images, labels}.
  std::vector<graph_feed> feeds;
  int tokens_node = -1;         ///< input node fed with token ids (B, T); -1 for an image model
  int targets_node = -1;        ///< input node fed with next-token targets (B, T); -1 likewise
  int logits_node = -1;         ///< node whose output is (B, T, V) logits (for sampling); -1 if none
  int loss_node = -1;           ///< scalar loss node

  /// Whether the model reads text (tokens and targets feeds).
  bool is_text() const { return tokens_node >= 0; }

  /// Node id by name, or -1.
  int find(const std::string& name) const;
  /// Total number of learnable scalars.
  int64_t param_count() const;
};

/// Loads and validates a model file for batch size `batch`. Throws graph_error naming file, line
/// and node for: parse errors, unknown op, missing or bad attribute, dangling or duplicate edge,
/// duplicate node name, cycle, shape mismatch, missing or inconsistent feeds, missing logits
/// (text models) or loss declarations.
graph load_graph(const std::string& path, int64_t batch);

/// Same, from text already in memory; `path` is used only in messages.
graph parse_graph(const std::string& text, const std::string& path, int64_t batch);

}  // namespace fusion
