// The CPU registry against the op-kind list (ops/op_kinds.hpp): op_kinds() is the list, sorted
// and without duplicates, and every kind's factory, given a value for each attribute the list
// names, makes an op of that kind.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ops/op_kinds.hpp"
#include "tests/ops/gradcheck.hpp"  // plausible_attributes

namespace fusion {

TEST_CASE("ops/registry: op_kinds() is the list of ops/op_kinds.hpp, sorted, without duplicates") {
  std::vector<std::string> listed;
#define FUSION_LISTED_KIND(kind, family, ...) listed.push_back(#kind);
  FUSION_OP_KINDS(FUSION_LISTED_KIND)
#undef FUSION_LISTED_KIND
  const std::vector<std::string> kinds = op_kinds();
  CHECK(std::is_sorted(kinds.begin(), kinds.end()));
  CHECK(std::adjacent_find(kinds.begin(), kinds.end()) == kinds.end());
  std::sort(listed.begin(), listed.end());
  CHECK(kinds == listed);
}

TEST_CASE("ops/registry: every kind is made under its own name with the attributes it lists") {
  for (const std::string& kind : op_kinds()) {
    INFO("kind " << kind);
    const std::unique_ptr<op> o = make_op(kind, test::plausible_attributes(kind));
    CHECK(std::string(o->kind()) == kind);
  }
  CHECK(op_attributes("add")->empty());
}

TEST_CASE("ops/registry: an unknown kind is an op_error naming the known kinds") {
  CHECK(op_attributes("lineer") == nullptr);
  CHECK_THROWS_WITH_AS(make_op("lineer", {}), doctest::Contains("unknown op 'lineer' (known: add, attention"),
                       op_error);
}

}  // namespace fusion
