// The table of op kinds. Explicit (no static self-registration) so that linking a static
// library never silently drops an op.
#include <algorithm>
#include <functional>

#include "ops/op.hpp"

namespace fusion {

// One factory per op kind, defined next to its kernels in ops/cpu/<stem>.cpp.
std::unique_ptr<op> make_token_embedding_op(const attr_map&);     // embedding.cpp
std::unique_ptr<op> make_position_embedding_op(const attr_map&);  // embedding.cpp
std::unique_ptr<op> make_conv2d_op(const attr_map&);              // conv.cpp
std::unique_ptr<op> make_linear_op(const attr_map&);              // linear.cpp
std::unique_ptr<op> make_matmul_op(const attr_map&);              // matmul.cpp
std::unique_ptr<op> make_layernorm_op(const attr_map&);           // layernorm.cpp
std::unique_ptr<op> make_gelu_op(const attr_map&);                // activation.cpp
std::unique_ptr<op> make_relu_op(const attr_map&);                // activation.cpp
std::unique_ptr<op> make_batchnorm_op(const attr_map&);           // batchnorm.cpp
std::unique_ptr<op> make_max_pool2d_op(const attr_map&);          // pool.cpp
std::unique_ptr<op> make_avg_pool2d_op(const attr_map&);          // pool.cpp
std::unique_ptr<op> make_global_avg_pool_op(const attr_map&);     // pool.cpp
std::unique_ptr<op> make_flatten_op(const attr_map&);             // pool.cpp
std::unique_ptr<op> make_attention_op(const attr_map&);           // attention.cpp
std::unique_ptr<op> make_add_op(const attr_map&);                 // add.cpp
std::unique_ptr<op> make_cross_entropy_op(const attr_map&);       // cross_entropy.cpp

namespace {

using factory = std::unique_ptr<op> (*)(const attr_map&);

struct op_entry {
  std::string kind;
  factory make;
  std::vector<std::string> attributes;  // every attribute the factory reads
};

const std::vector<op_entry>& table() {
  static const std::vector<op_entry> t = {
      {"add", make_add_op, {}},
      {"attention", make_attention_op, {"heads", "causal"}},
      {"avg_pool2d", make_avg_pool2d_op, {"kernel", "stride", "padding"}},
      {"batchnorm2d", make_batchnorm_op, {"eps", "momentum"}},
      {"conv2d", make_conv2d_op, {"out", "kernel", "stride", "padding", "dilation", "groups", "bias", "init_std"}},
      {"cross_entropy", make_cross_entropy_op, {}},
      {"flatten", make_flatten_op, {}},
      {"gelu", make_gelu_op, {}},
      {"global_avg_pool", make_global_avg_pool_op, {}},
      {"layernorm", make_layernorm_op, {"eps"}},
      {"linear", make_linear_op, {"out", "in", "bias", "init_std"}},
      {"matmul", make_matmul_op, {"transpose_b"}},
      {"max_pool2d", make_max_pool2d_op, {"kernel", "stride", "padding"}},
      {"position_embedding", make_position_embedding_op, {"max_len", "dim"}},
      {"relu", make_relu_op, {}},
      {"token_embedding", make_token_embedding_op, {"vocab", "dim"}},
  };
  return t;
}

}  // namespace

std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) {
  for (auto& e : table())
    if (e.kind == kind) return e.make(attrs);
  std::string known;
  for (auto& k : op_kinds()) known += (known.empty() ? "" : ", ") + k;
  throw op_error("unknown op '" + kind + "' (known: " + known + ")");
}

std::vector<std::string> op_kinds() {
  std::vector<std::string> out;
  for (auto& e : table()) out.push_back(e.kind);
  return out;
}

const std::vector<std::string>* op_attributes(const std::string& kind) {
  for (auto& e : table())
    if (e.kind == kind) return &e.attributes;
  return nullptr;
}

}  // namespace fusion
