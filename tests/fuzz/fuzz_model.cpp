// Fuzzes the model-file loader (core/graph.hpp parse_graph): protobuf text format, templates,
// blocks, feeds and the arithmetic expressions of attributes, shapes, repeats and constants
// (core/graph_expr.hpp), then validation and shape inference with the real op table.
//
// The loader's contract is graph_error "FILE:LINE: ..." for any bad model; any other exception
// escaping it is reported as a bug, like a crash or a sanitizer finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/graph.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    // Batch 2: small enough that shape inference of a real model stays cheap, and not 1, so a
    // batch dimension mixed up with another one still shows.
    auto g = fusion::parse_graph(text, "fuzz.pbtxt", 2);
    (void)g.param_count();
  } catch (const fusion::graph_error&) {
    // A refused model: the expected outcome for almost every input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parse_graph threw %s instead of graph_error\n", e.what());
    std::abort();
  }
  return 0;
}
