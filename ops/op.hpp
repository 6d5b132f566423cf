// The operator contract every OP-DAG node implements, on every backend.
//
// An op is a pure function object: it holds its attributes, never its parameters or activations.
// The op actor owns those (parameters, gradients, optimizer state, saved activations keyed by
// micro-batch) and calls forward/backward with them. One node has exactly one output tensor;
// fan-out happens in the graph, and backward ACCUMULATES (+=) into input and parameter gradients,
// so a node whose output feeds several consumers just receives several gradients.
//
// Precision: floating inputs, params, gradients and the output of one call all share one dtype,
// the dtype of `output`: f32 in training, f64 when tests check gradients by finite differences.
// CPU kernels are therefore templates over the element type. CUDA ops (ops/cuda/) take f32
// only, with every tensor of the call in device memory, and throw op_error otherwise.
//
// Shape legend used across ops/: B batch (micro-batch), T time/context, C channels,
// V vocabulary, NH heads, HS head size (C / NH), K/N linear input/output features; images are
// NCHW: (B, C, H, W) with H x W pixels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "tensor/tensor.hpp"

namespace fusion {

/// Thrown by ops for bad attributes or input shapes; the graph loader adds file, line and node.
struct op_error : error {
  using error::error;
};

/// Resolved node attributes (the loader has already evaluated expressions like "4*C").
class attr_map {
 public:
  attr_map() = default;
  explicit attr_map(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  /// attr_map({{"out", "256"}}); without it a single braced pair is ambiguous.
  attr_map(std::initializer_list<std::pair<const std::string, std::string>> values) : values_(values) {}

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  /// Required integer attribute; throws op_error naming the key when missing or not an integer.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  void set(const std::string& key, std::string value) { values_[key] = std::move(value); }
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

/// How a parameter is initialised.
enum class param_init : uint8_t { zeros, ones, normal };

/// One learnable tensor of an op.
struct param_spec {
  std::string name;   ///< e.g. "weight", "bias"; unique within the op
  shape_t shape;
  param_init init = param_init::zeros;
  float stddev = 0.02f;  ///< for param_init::normal
  bool decay = false;    ///< AdamW weight decay applies (matrices yes, biases and norms no)
};

/// One non-trainable state tensor of an op (batch norm's running statistics). The op actor
/// creates it with the parameters (same dtype as the output), passes it to every forward call,
/// saves it in checkpoints and carries it wherever the op's state goes; it never gets a
/// gradient or an optimizer update. Forward in training mode may update it in place.
struct buffer_spec {
  std::string name;   ///< e.g. "running_mean"; unique within the op, distinct from parameter names
  shape_t shape;
  param_init init = param_init::zeros;  ///< zeros or ones
};

/// A quantity a loss op reports besides the loss, summed over micro-batches and batches and
/// shown as sum / count (accuracy: correct predictions / predictions).
struct metric_value {
  double sum = 0;
  double count = 0;
};

/// Analytic work of one forward+backward call, for the workload estimator.
struct op_cost {
  double flops_forward = 0;   ///< floating-point operations (multiply-add = 2)
  double flops_backward = 0;
  double bytes_forward = 0;   ///< memory traffic estimate: inputs + params + output
  double bytes_backward = 0;
  double param_bytes = 0;     ///< bytes of parameters
  double output_bytes = 0;    ///< bytes of the output activation (what an edge carries forward)
};

/// Arguments of a forward call. `saved` starts empty; the op may stash intermediates there that
/// its backward needs (for example layer-norm statistics or attention probabilities).
struct forward_args {
  std::span<const tensor* const> inputs;
  std::span<const tensor* const> params;
  tensor* output;               ///< allocated with the inferred shape, contents undefined:
                                ///< forward must write every element (tests poison it with NaN)
  std::vector<tensor>* saved;   ///< kept by the actor for this micro-batch until backward
  /// Stream and library handles of the calling actor (ops/backend.hpp backend::context()).
  /// CPU ops ignore it; CUDA ops queue their kernels on its stream, or on the calling thread's
  /// default context when it is null.
  const exec_context* ctx = nullptr;
  /// The op's buffers (op::buffers), in that order; updated in place in training mode.
  std::span<tensor* const> buffers = {};
  /// Training (batch statistics; buffers updated) or evaluation (buffers read only). Ops
  /// without buffers compute the same either way.
  bool training = true;
  /// When set, a loss op appends one value per op::metric_names(), in that order.
  std::vector<metric_value>* metrics = nullptr;
};

/// Arguments of a backward call. Every gradient pointer is accumulated into (+=), never
/// overwritten; a null entry in `input_grads` means that input needs no gradient.
struct backward_args {
  std::span<const tensor* const> inputs;  ///< empty tensors when !op::backward_reads_inputs()
  std::span<const tensor* const> params;
  const tensor* output_grad;
  const std::vector<tensor>* saved;
  std::span<tensor* const> input_grads;
  std::span<tensor* const> param_grads;
  const exec_context* ctx = nullptr;  ///< as forward_args::ctx
};

/// The per-op interface: shape inference, parameters, forward, backward and cost.
class op {
 public:
  virtual ~op() = default;
  /// Registered kind name, e.g. "linear".
  virtual const char* kind() const = 0;
  /// Expected number of inputs (-1: any number >= 1).
  virtual int arity() const = 0;
  /// Checks input shapes/dtypes against the attributes; returns the output shape or throws op_error.
  virtual shape_t infer_shape(std::span<const shape_t> inputs, std::span<const dtype> types) const = 0;
  /// Learnable parameters for these input shapes (empty for parameter-free ops).
  virtual std::vector<param_spec> params(std::span<const shape_t> inputs) const { (void)inputs; return {}; }
  /// Non-trainable state for these input shapes (empty for most ops; batch norm's running
  /// statistics).
  virtual std::vector<buffer_spec> buffers(std::span<const shape_t> inputs) const { (void)inputs; return {}; }
  /// Names of the metrics forward reports through forward_args::metrics (a loss op's
  /// "accuracy"); empty for most ops.
  virtual std::vector<std::string> metric_names() const { return {}; }
  /// Whether input `i` receives a gradient (token ids and targets do not).
  virtual bool input_has_grad(size_t i) const { (void)i; return true; }
  /// Whether backward reads the values of the inputs. When false (add, identity, flatten,
  /// pooling: their gradients follow from the output gradient, shapes and `saved` alone) the op
  /// actor frees the inputs after forward, and backward gets empty tensors in
  /// backward_args::inputs: it takes shapes from the output gradient and the input gradients,
  /// which are allocated with the inputs' shapes. A residual stream then holds no copy per add
  /// and per fan-out node between a micro-batch's forward and its backward.
  virtual bool backward_reads_inputs() const { return true; }
  virtual void forward(const forward_args& a) const = 0;
  virtual void backward(const backward_args& a) const = 0;
  virtual op_cost cost(std::span<const shape_t> inputs) const = 0;
};

/// Creates the CPU implementation of `kind` (CUDA ops come from a backend, ops/backend.hpp); throws op_error for an unknown kind or bad attributes.
std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs);

/// Every registered op kind, sorted (for error messages and docs).
std::vector<std::string> op_kinds();

/// The attribute names op `kind` accepts (the loader rejects any other), or null for an unknown kind.
const std::vector<std::string>* op_attributes(const std::string& kind);

}  // namespace fusion
