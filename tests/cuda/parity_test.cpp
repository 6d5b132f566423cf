// The CUDA parity tests, one per op kind of ops/op_kinds.hpp: each runs the kind's case
// (FUSION_PARITY_CASE in ops_test.cpp or cnn_ops_test.cpp) on the GPU, and fails, GPU or not,
// when the kind has no case. Two checks that run without a GPU guard the tables themselves:
// every registered case names a kind of the list, once; and every kind's CUDA op is built from
// the same attributes as the CPU op, with the same kind name and metrics.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "ops/cuda/cuda_backend.hpp"
#include "ops/op_kinds.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

namespace {

// Fails (without a GPU too) when `kind` has no parity case; otherwise runs it, or skips.
void run_parity_case(const std::string& kind) {
  const auto it = parity_cases().find(kind);
  REQUIRE_MESSAGE(it != parity_cases().end(),
                  kind << ": no CUDA parity case; add FUSION_PARITY_CASE(" << kind
                       << ", g) { compare_op(g, \"" << kind << "\", ...); } to tests/cuda/ops_test.cpp or "
                       << "cnn_ops_test.cpp");
  FUSION_GPU_OR_SKIP(g);
  it->second.run(g);
}

}  // namespace

// "cuda <kind> matches the CPU", generated from the list: a new kind gets its test case here.
#define FUSION_PARITY_TEST(kind, family, ...) \
  TEST_CASE("cuda " #kind " matches the CPU") { run_parity_case(#kind); }
FUSION_OP_KINDS(FUSION_PARITY_TEST)
#undef FUSION_PARITY_TEST

TEST_CASE("every op kind has one parity case and every parity case an op kind") {
  const std::vector<std::string> listed = op_kinds();
  const std::set<std::string> kinds(listed.begin(), listed.end());
  for (const auto& [kind, entry] : parity_cases()) {
    std::string files;
    for (const std::string& f : entry.files) files += (files.empty() ? "" : ", ") + f;
    INFO("parity case " << kind << " (" << files << ")");
    // A misspelt kind's case would never run, while the real kind failed for lack of one.
    CHECK_MESSAGE(kinds.count(kind) == 1, kind << " is not an op kind of ops/op_kinds.hpp");
    CHECK_MESSAGE(entry.files.size() == 1, kind << " has " << entry.files.size() << " parity cases");
  }
  for (const std::string& kind : listed) CHECK_MESSAGE(parity_cases().count(kind) == 1, kind << ": no parity case");
}

TEST_CASE("every CPU op kind has a CUDA implementation") {
  // Constructing an op reads attributes only (no device call), so this runs without a GPU.
  std::string missing;
  for (const std::string& kind : op_kinds()) {
    const attr_map attrs = plausible_attributes(kind);
    std::unique_ptr<op> cpu_op;
    try {
      cpu_op = make_op(kind, attrs);
    } catch (const op_error& e) {
      FAIL_CHECK(kind << ": the CPU op rejects the test's plausible attributes (" << e.what()
                      << "); fix its value in plausible_attributes (tests/ops/gradcheck.hpp)");
      continue;
    }
    try {
      auto gpu_op = cuda::make_op(kind, attrs);
      CHECK(std::string(gpu_op->kind()) == kind);
      CHECK(gpu_op->metric_names() == cpu_op->metric_names());
    } catch (const op_error& e) {
      missing += "\n  " + kind + ": " + e.what();
    }
  }
  CHECK_MESSAGE(missing.empty(), "op kinds whose CUDA op cannot be made (ops/cuda/<family>.cu):" << missing);
}

}  // namespace fusion::test
