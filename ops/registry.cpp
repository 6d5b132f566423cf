// The CPU registry, generated from the op-kind list (ops/op_kinds.hpp). Explicit (no static
// self-registration) so that linking a static library never silently drops an op.
#include <algorithm>

#include "ops/op_kinds.hpp"

namespace fusion {

namespace {

using factory = std::unique_ptr<op> (*)(const attr_map&);

struct op_entry {
  std::string kind;
  factory make;
  std::vector<std::string> attributes;  // every attribute the factory reads
};

const std::vector<op_entry>& table() {
#define FUSION_CPU_ENTRY(kind, family, ...) {#kind, make_##kind##_cpu, {__VA_ARGS__}},
  static const std::vector<op_entry> t = {FUSION_OP_KINDS(FUSION_CPU_ENTRY)};
#undef FUSION_CPU_ENTRY
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
  // The list is written sorted; sorting here keeps the promise if a line lands out of order.
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>* op_attributes(const std::string& kind) {
  for (auto& e : table())
    if (e.kind == kind) return &e.attributes;
  return nullptr;
}

}  // namespace fusion
