// Fuzzes the cluster-file loader (core/cluster.hpp parse_cluster): protobuf text format, sites,
// nodes, devices, links, the coordinator address and the placement section with its globs.
//
// The loader's contract is cluster_error "FILE:LINE: ..." for any bad file; any other exception
// escaping it is reported as a bug, like a crash or a sanitizer finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/cluster.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto spec = fusion::parse_cluster(text, "fuzz.pbtxt");
    // The lookups every user of a loaded file makes, over everything it holds.
    const int n = static_cast<int>(spec.nodes.size());
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) (void)spec.node_link_mbit(i, j);
  } catch (const fusion::cluster_error&) {
    // A refused file: the expected outcome for almost every input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parse_cluster threw %s instead of cluster_error\n", e.what());
    std::abort();
  }
  return 0;
}
