// Model loader size and depth limits (docs/model-format.md, "Limits"): each case is a model file a
// new user could write that used to crash a tool (a segmentation fault, std::bad_alloc, or an
// internal message at training time) and must now be refused at load time with the file, the
// line and the node or constant. They load with the real ops, which is what fusion-cluster check
// and fusion-train run; nothing here allocates a tensor, so the huge sizes cost nothing.
#include <doctest/doctest.h>

#include <string>

#include "core/graph.hpp"
#include "core/graph_expr.hpp"
#include "tests/support/graph_errors.hpp"

namespace fusion {
namespace {

// A small GPT-like chain: wte, wpe, head, loss. The constants are expressions, so a test can
// write "2^62" as 4611686018427387904 or tie max_len to T. Lines: V 2, T 3, C 4, ML 5, tokens 6,
// targets 7, wte 8, wpe 9, head 10, loss 11.
std::string chain(const std::string& V, const std::string& T, const std::string& C, const std::string& ML) {
  return "name: \"m\"\n"
         "const { name: \"V\" expr: \"" + V + "\" }\n"
         "const { name: \"T\" expr: \"" + T + "\" }\n"
         "const { name: \"C\" expr: \"" + C + "\" }\n"
         "const { name: \"ML\" expr: \"" + ML + "\" }\n"
         "input { name: \"tokens\" shape: \"B,T\" dtype: I32 }\n"
         "input { name: \"targets\" shape: \"B,T\" dtype: I32 }\n"
         "node { name: \"wte\" op: \"token_embedding\" in: \"tokens\" attr { key: \"vocab\" value: \"V\" }"
         " attr { key: \"dim\" value: \"C\" } }\n"
         "node { name: \"wpe\" op: \"position_embedding\" in: \"wte\" attr { key: \"max_len\" value: \"ML\" } }\n"
         "node { name: \"head\" op: \"linear\" in: \"wpe\" attr { key: \"out\" value: \"V\" }"
         " attr { key: \"bias\" value: \"false\" } }\n"
         "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"targets\" }\n"
         "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n";
}

// The message of loading `text` with the real ops for batch 2; it must fail with a graph_error.
std::string error_of(const std::string& text) { return test::graph_error_of([&] { parse_graph(text, "m.pbtxt", 2); }); }

#define CHECK_REFUSED(text, where, ...)                                                  \
  do {                                                                                   \
    std::string msg_ = error_of(text);                                                   \
    INFO(msg_);                                                                          \
    CHECK(msg_.rfind(where, 0) == 0);                                                    \
    for (const char* part : {__VA_ARGS__}) CHECK(msg_.find(part) != std::string::npos); \
    CHECK(msg_.find("bad_alloc") == std::string::npos);                                  \
  } while (false)

TEST_CASE("graph limits: the chain model loads within the limits") {
  graph g = parse_graph(chain("8", "4", "6", "T"), "m.pbtxt", 2);
  CHECK(g.param_count() == 8 * 6 + 4 * 6 + 6 * 8);
}

TEST_CASE("graph limits: a position-embedding max_len whose table wraps int64 is refused, not sized small") {
  // 2^62 x 256 = 2^70 wraps to 0: the runtime used to allocate an empty table and the first
  // forward read past it (segmentation fault).
  CHECK_REFUSED(chain("8", "4", "256", "4611686018427387904"), "m.pbtxt:9: node 'wpe' (position_embedding): ",
                "parameter 'weight' [4611686018427387904, 256]", "4611686018427387904 x 256 elements",
                "more than the limit of 2^32 (4294967296) elements per tensor", "max_len=4611686018427387904");
}

TEST_CASE("graph limits: a huge context constant is refused at the input that uses it") {
  // B*T = 2 * 2^62 wraps; fusion-cluster check used to pass this model and training failed later.
  CHECK_REFUSED(chain("8", "4611686018427387904", "6", "T"), "m.pbtxt:6: input 'tokens': ",
                "shape [2, 4611686018427387904]", "more than the limit of 2^32");
  // Large but without wrapping: still far beyond any tensor the runtime can hold.
  CHECK_REFUSED(chain("8", "1000000000000", "6", "T"), "m.pbtxt:6: input 'tokens': ",
                "2 x 1000000000000 = 2000000000000 elements");
}

TEST_CASE("graph limits: a vocabulary or max_len of 10^12 is refused before anything is allocated") {
  CHECK_REFUSED(chain("1000000000000", "4", "64", "T"), "m.pbtxt:8: node 'wte' (token_embedding): ",
                "parameter 'weight' [1000000000000, 64]", "= 64000000000000 elements", "vocab=1000000000000");
  CHECK_REFUSED(chain("8", "4", "64", "1000000000000"), "m.pbtxt:9: node 'wpe' (position_embedding): ",
                "parameter 'weight' [1000000000000, 64]", "max_len=1000000000000");
  // A wide output is refused as an output shape, with the attribute that made it wide.
  CHECK_REFUSED(chain("8", "4", "1000000000000", "T"), "m.pbtxt:8: node 'wte' (token_embedding): ",
                "output shape [2, 4, 1000000000000]", "dim=1000000000000");
}

// tokens -> wte (dim 3*C) -> attention (heads NH) -> head -> loss, for batch 2.
std::string attention_model(const std::string& T, const std::string& NH) {
  return "name: \"a\"\n"
         "const { name: \"T\" expr: \"" + T + "\" }\n"
         "input { name: \"tokens\" shape: \"B,T\" dtype: I32 }\n"
         "input { name: \"targets\" shape: \"B,T\" dtype: I32 }\n"
         "node { name: \"wte\" op: \"token_embedding\" in: \"tokens\" attr { key: \"vocab\" value: \"8\" }"
         " attr { key: \"dim\" value: \"6\" } }\n"
         "node { name: \"attn\" op: \"attention\" in: \"wte\" attr { key: \"heads\" value: \"" + NH + "\" } }\n"
         "node { name: \"head\" op: \"linear\" in: \"attn\" attr { key: \"out\" value: \"8\" } }\n"
         "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"targets\" }\n"
         "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n";
}

TEST_CASE("graph limits: attention's saved (B, heads, T, T) probabilities count as a tensor") {
  // 2 x 1 x 40000 x 40000 = 3.2e9 elements: within 2^32, loads.
  CHECK_NOTHROW(parse_graph(attention_model("40000", "1"), "a.pbtxt", 2));
  // Two heads: 6.4e9, which would end in std::bad_alloc at the first forward.
  CHECK_REFUSED(attention_model("40000", "2"), "m.pbtxt:6: node 'attn' (attention): ",
                "saved probabilities (B, heads, T, T) = (2, 2, 40000, 40000)", "more than 2^32");
}

// tokens -> wte (dim C = 65536) -> L bias-free C x C linears -> head: each linear's weight is
// exactly 2^32 elements, the largest tensor allowed.
std::string wide_model(int L) {
  return "name: \"w\"\n"
         "const { name: \"C\" value: 65536 }\n"
         "input { name: \"tokens\" shape: \"B,4\" dtype: I32 }\n"
         "input { name: \"targets\" shape: \"B,4\" dtype: I32 }\n"
         "node { name: \"wte\" op: \"token_embedding\" in: \"tokens\" attr { key: \"vocab\" value: \"8\" }"
         " attr { key: \"dim\" value: \"C\" } }\n"
         "block { name: \"h\" repeat: \"" + std::to_string(L) + "\" input: \"wte\" output: \"f\"\n"
         "  node { name: \"f\" op: \"linear\" in: \"$in\" attr { key: \"out\" value: \"C\" }"
         " attr { key: \"bias\" value: \"false\" } }\n"
         "}\n"
         "node { name: \"head\" op: \"linear\" in: \"h\" attr { key: \"out\" value: \"8\" }"
         " attr { key: \"bias\" value: \"false\" } }\n"
         "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"targets\" }\n"
         "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n";
}

TEST_CASE("graph limits: one tensor of exactly 2^32 elements loads, a model beyond 2^36 parameters does not") {
  static_assert(graph_max_tensor_elements == int64_t{1} << 32 && graph_max_params == int64_t{1} << 36);
  graph g = parse_graph(wide_model(15), "w.pbtxt", 2);
  CHECK(g.param_count() == 15 * graph_max_tensor_elements + 2 * 8 * 65536);
  // The 16th linear takes the total to 2^36 + 2^19: refused at that instance's line.
  CHECK_REFUSED(wide_model(16), "m.pbtxt:7: node 'h15.f' (linear): ", "the model's parameters reach",
                "more than the limit of 2^36 (68719476736) per model");
  // One more column and a single weight is over the per-tensor limit.
  std::string over = wide_model(1);
  over.replace(over.find("65536"), 5, "65537");
  CHECK_REFUSED(over, "m.pbtxt:7: node 'h0.f' (linear): ", "parameter 'weight' [65537, 65537]",
                "65537 x 65537 = 4295098369 elements", "out=65537");
}

TEST_CASE("graph limits: expression nesting is bounded instead of overflowing the stack") {
  const graph_constants c{{"C", graph_value::of_int(6)}};
  auto nested = [](int n, const std::string& open, const std::string& inner) {
    std::string s;
    for (int i = 0; i < n; ++i) s += open;
    s += inner;
    if (open.back() == '(') s += std::string(static_cast<size_t>(n), ')');
    return s;
  };
  CHECK(eval_graph_expr(nested(max_graph_expr_depth - 1, "(", "C"), c).i == 6);
  CHECK(eval_graph_expr(nested(max_graph_expr_depth - 1, "-", "C"), c).i == -6);
  struct too_deep {
    std::string open;
    int n;
  };
  for (const too_deep& t : {too_deep{"(", max_graph_expr_depth}, too_deep{"(", 10000}, too_deep{"-", 10000},
                            too_deep{"sqrt(", 10000}}) {
    CAPTURE(t.open);
    CAPTURE(t.n);
    CHECK_THROWS_WITH_AS(eval_graph_expr(nested(t.n, t.open, "C"), c),
                         doctest::Contains("nested more than 64 levels"), graph_expr_error);
  }
  // In a model file: the file, line and attribute, and only the start of the long expression.
  std::string m = chain("8", "4", "6", "T");
  m.replace(m.find("value: \"ML\""), 11, "value: \"" + nested(10000, "(", "T") + "\"");
  CHECK_REFUSED(m, "m.pbtxt:9: node 'wpe' (position_embedding): ", "attribute 'max_len' \"((((", "...\": ",
                "nested more than 64 levels deep");
  CHECK(error_of(m).size() < 400);
  // And in a constant.
  CHECK_REFUSED(chain("8", nested(10000, "(", "4"), "6", "T"), "m.pbtxt:3: const 'T': ", "nested more than 64");
}

// Found by tests/fuzz/fuzz_model.cpp: a 5 KB file whose block of 100 nodes repeats 10000 times
// built a million nodes (1.2 GB and minutes under ASan) before any error. The limit is now 2^16
// nodes, and a block that would pass it is refused at its repeat line before it expands.
TEST_CASE("graph limits: a block that would expand past 65536 nodes is refused before expanding") {
  auto repeated = [](int nodes, const std::string& repeat) {
    std::string m = chain("8", "4", "6", "T");
    std::string body;
    for (int i = 0; i < nodes; ++i)
      body += "  node { name: \"g" + std::to_string(i) + "\" op: \"gelu\" in: \"" +
              (i == 0 ? std::string("$in") : "g" + std::to_string(i - 1)) + "\" }\n";
    const std::string block = "block { name: \"h\" repeat: \"" + repeat + "\" input: \"wpe\" output: \"g" +
                              std::to_string(nodes - 1) + "\"\n" + body + "}\n";
    m.insert(m.find("node { name: \"head\""), block);
    m.replace(m.find("in: \"wpe\" attr { key: \"out\""), 9, "in: \"h\"");
    return m;
  };
  graph g = parse_graph(repeated(3, "2"), "m.pbtxt", 2);  // the chain with a block in it loads
  CHECK(g.find("h1.g2") >= 0);
  CHECK_REFUSED(repeated(100, "10000"), "m.pbtxt:10: block 'h': ",
                "repeat 10000 of 100 nodes makes the model more than 65536 nodes", "\"Limits\"");
  // The 4 nodes before the block leave room for 9361 instances of 7 nodes.
  CHECK_REFUSED(repeated(7, "9362"), "m.pbtxt:10: block 'h': ", "repeat 9362 of 7 nodes");
}

}  // namespace
}  // namespace fusion

namespace fusion {
namespace {

TEST_CASE("graph limits: a node name too long for a checkpoint is refused at load, not after training") {
  // The model: a node name over 4096 bytes loaded and trained, then the checkpoint of its
  // parameters failed ("tensor name ... must have 1..4096 bytes") and the run was lost.
  const std::string long_name(5000, 'h');
  std::string text = chain("8", "4", "16", "4");
  auto at = text.find("\"head\"");
  text.replace(at, 6, "\"" + long_name + "\"");
  at = text.find("in: \"head\"");
  text.replace(at + 4, 6, "\"" + long_name + "\"");
  at = text.find("logits: \"head\"");
  text.replace(at + 8, 6, "\"" + long_name + "\"");
  CHECK_REFUSED(text, "m.pbtxt:10: node 'hhhh", "its name has 5000 bytes, more than 1024",
                "a checkpoint could not hold its parameters");
  // At the limit it loads.
  std::string ok = chain("8", "4", "16", "4");
  const std::string name_1024(1024, 'h');
  for (auto [from, to] : {std::pair<const char*, std::string>{"name: \"head\"", "name: \"" + name_1024 + "\""},
                          {"in: \"head\"", "in: \"" + name_1024 + "\""},
                          {"logits: \"head\"", "logits: \"" + name_1024 + "\""}})
    ok.replace(ok.find(from), std::string(from).size(), to);
  CHECK_NOTHROW(parse_graph(ok, "m.pbtxt", 2));
}

}  // namespace
}  // namespace fusion
