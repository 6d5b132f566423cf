// The table of op kinds. Explicit (no static self-registration) so that linking a static
// library never silently drops an op.
#include <algorithm>
#include <functional>

#include "ops/op.hpp"

namespace fusion {

// One factory per op kind, defined next to its kernels in ops/cpu/<stem>.cpp.
std::unique_ptr<op> make_token_embedding_op(const attr_map&);     // embedding.cpp
std::unique_ptr<op> make_position_embedding_op(const attr_map&);  // embedding.cpp
std::unique_ptr<op> make_linear_op(const attr_map&);              // linear.cpp
std::unique_ptr<op> make_matmul_op(const attr_map&);              // matmul.cpp
std::unique_ptr<op> make_layernorm_op(const attr_map&);           // layernorm.cpp
std::unique_ptr<op> make_gelu_op(const attr_map&);                // activation.cpp
std::unique_ptr<op> make_relu_op(const attr_map&);                // activation.cpp
std::unique_ptr<op> make_attention_op(const attr_map&);           // attention.cpp
std::unique_ptr<op> make_add_op(const attr_map&);                 // add.cpp
std::unique_ptr<op> make_cross_entropy_op(const attr_map&);       // cross_entropy.cpp

namespace {

using factory = std::unique_ptr<op> (*)(const attr_map&);

const std::vector<std::pair<std::string, factory>>& table() {
  static const std::vector<std::pair<std::string, factory>> t = {
      {"add", make_add_op},
      {"attention", make_attention_op},
      {"cross_entropy", make_cross_entropy_op},
      {"gelu", make_gelu_op},
      {"layernorm", make_layernorm_op},
      {"linear", make_linear_op},
      {"matmul", make_matmul_op},
      {"position_embedding", make_position_embedding_op},
      {"relu", make_relu_op},
      {"token_embedding", make_token_embedding_op},
  };
  return t;
}

}  // namespace

std::unique_ptr<op> make_op(const std::string& kind, const attr_map& attrs) {
  for (auto& [name, make] : table())
    if (name == kind) return make(attrs);
  std::string known;
  for (auto& k : op_kinds()) known += (known.empty() ? "" : ", ") + k;
  throw op_error("unknown op '" + kind + "' (known: " + known + ")");
}

std::vector<std::string> op_kinds() {
  std::vector<std::string> out;
  for (auto& [name, make] : table()) out.push_back(name);
  return out;
}

}  // namespace fusion
