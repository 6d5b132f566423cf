// Model loader tests: block expansion, ordering, one test per validation error (each checks the
// file name, line and node named in the message), and the three model files.
//
// Structure tests run on stand-in ops (stub_op below: shapes and params per the op contract,
// no kernels) so they do not depend on the real ops; the model-file tests use the real ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/graph_expr.hpp"
#include "core/graph_loader.hpp"
#include "tests/support/graph_errors.hpp"

namespace fusion {
namespace {

using shape_fn = std::function<shape_t(std::span<const shape_t>)>;
using params_fn = std::function<std::vector<param_spec>(std::span<const shape_t>)>;

class stub_op : public op {
 public:
  stub_op(std::string kind, int arity, shape_fn shape, params_fn params = {})
      : kind_(std::move(kind)), arity_(arity), shape_(std::move(shape)), params_(std::move(params)) {}
  const char* kind() const override { return kind_.c_str(); }
  int arity() const override { return arity_; }
  shape_t infer_shape(std::span<const shape_t> in, std::span<const dtype>) const override { return shape_(in); }
  std::vector<param_spec> params(std::span<const shape_t> in) const override {
    return params_ ? params_(in) : std::vector<param_spec>{};
  }
  void forward(const forward_args&) const override { throw op_error("stub"); }
  void backward(const backward_args&) const override { throw op_error("stub"); }
  op_cost cost(std::span<const shape_t>) const override { return {}; }

 private:
  std::string kind_;
  int arity_;
  shape_fn shape_;
  params_fn params_;
};

param_spec p(const char* name, shape_t s) { return {name, std::move(s)}; }

// GPT-2 shapes and parameter counts written from the paper, independent of ops/.
std::unique_ptr<op> make_stub(const std::string& kind, const attr_map& a) {
  auto same = [](std::span<const shape_t> in) { return in[0]; };
  if (kind == "token_embedding") {
    int64_t v = a.get_int("vocab"), c = a.get_int("dim");
    return std::make_unique<stub_op>(kind, 1, [c](auto in) { return shape_t{in[0][0], in[0][1], c}; },
                                     [v, c](auto) { return std::vector{p("weight", {v, c})}; });
  }
  if (kind == "position_embedding") {
    int64_t t = a.get_int("max_len");
    return std::make_unique<stub_op>(kind, 1, [t](auto in) {
      if (in[0][1] > t) throw op_error("position_embedding: T > max_len");
      return in[0];
    }, [t](auto in) { return std::vector{p("weight", {t, in[0].back()})}; });
  }
  if (kind == "linear") {
    int64_t n = a.get_int("out");
    bool bias = a.get_bool("bias", true);
    return std::make_unique<stub_op>(kind, 1, [n](auto in) { auto s = in[0]; s.back() = n; return s; },
                                     [n, bias](auto in) {
      std::vector<param_spec> ps{p("weight", {n, in[0].back()})};
      if (bias) ps.push_back(p("bias", {n}));
      return ps;
    });
  }
  if (kind == "layernorm")
    return std::make_unique<stub_op>(kind, 1, same, [](auto in) {
      return std::vector{p("weight", {in[0].back()}), p("bias", {in[0].back()})};
    });
  if (kind == "gelu") return std::make_unique<stub_op>(kind, 1, same);
  if (kind == "attention") {
    int64_t h = a.get_int("heads");
    if (h < 1) throw op_error("attention: attribute 'heads' must be > 0");
    return std::make_unique<stub_op>(kind, 1, [](auto in) { auto s = in[0]; s.back() /= 3; return s; });
  }
  if (kind == "add")
    return std::make_unique<stub_op>(kind, 2, [](auto in) {
      if (in[0] != in[1]) throw op_error("add: shapes " + to_string(in[0]) + " and " + to_string(in[1]) + " differ");
      return in[0];
    });
  if (kind == "cross_entropy") return std::make_unique<stub_op>(kind, 2, [](auto) { return shape_t{}; });
  throw op_error("no stub for " + kind);
}

const graph_op_table stubs{make_stub, {"add", "attention", "cross_entropy", "gelu", "layernorm", "linear",
                                       "position_embedding", "token_embedding"}};

// A valid model with `body` starting at line 8; `last` is the node feeding the head.
std::string model(const std::string& body, const std::string& last = "x", const std::string& decls =
                      "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n") {
  return "name: \"m\"\n"
         "const { name: \"V\" value: 8 }\n"
         "const { name: \"T\" value: 4 }\n"
         "const { name: \"C\" value: 6 }\n"
         "input { name: \"tokens\" shape: \"B,T\" dtype: I32 }\n"
         "input { name: \"targets\" shape: \"B,T\" dtype: I32 }\n"
         "node { name: \"emb\" op: \"token_embedding\" in: \"tokens\" attr { key: \"vocab\" value: \"V\" }"
         " attr { key: \"dim\" value: \"C\" } }\n" +
         body + "node { name: \"head\" op: \"linear\" in: \"" + last + "\" attr { key: \"out\" value: \"V\" } }\n" +
         "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"targets\" }\n" + decls;
}

graph load(const std::string& text) { return parse_graph_with(text, "m.pbtxt", 2, stubs); }

std::string error_of(const std::string& text) { return test::graph_error_of([&] { load(text); }); }

#define CHECK_ERROR CHECK_GRAPH_ERROR

const std::string lin_x = "node { name: \"x\" op: \"linear\" in: \"emb\" attr { key: \"out\" value: \"C\" } }\n";

TEST_CASE("core/graph: a valid model has file order, ids, consumers and shapes") {
  graph g = load(model(lin_x));
  REQUIRE(g.nodes.size() == 6);
  const char* names[] = {"tokens", "targets", "emb", "x", "head", "loss"};
  for (int i = 0; i < 6; ++i) CHECK(g.nodes[i].name == names[i]);
  for (auto& n : g.nodes) {
    CHECK(n.id == g.find(n.name));
    for (size_t s = 0; s < n.inputs.size(); ++s) {
      CHECK(n.inputs[s] < n.id);
      auto& cons = g.nodes[n.inputs[s]].consumers;
      CHECK(std::count_if(cons.begin(), cons.end(), [&](auto& c) { return c.node == n.id && c.slot == int(s); }) == 1);
    }
  }
  CHECK(g.nodes[g.loss_node].inputs == std::vector<int>{g.find("head"), g.find("targets")});
  CHECK(g.nodes[g.find("head")].shape == shape_t{2, 4, 8});
  CHECK(g.nodes[g.find("tokens")].type == dtype::i32);
  CHECK(g.nodes[g.find("head")].line == 9);
  CHECK(g.context == 4);
  CHECK(g.vocab == 8);
  CHECK(g.batch == 2);
  CHECK(g.name == "m");
  CHECK(g.nodes[g.find("x")].attrs.get_int("out") == 6);
}

TEST_CASE("core/graph: blocks repeat, chain through $in and alias their last output") {
  std::string body = "const { name: \"L\" value: 3 }\n"
                     "block { name: \"h\" repeat: \"L\" input: \"emb\" output: \"r\"\n"
                     "  node { name: \"f\" op: \"linear\" in: \"$in\" attr { key: \"out\" value: \"2*C+0*L\" } }\n"
                     "  node { name: \"g\" op: \"linear\" in: \"f\" attr { key: \"out\" value: \"C\" } }\n"
                     "  node { name: \"r\" op: \"add\" in: \"$in\" in: \"g\" }\n"
                     "}\n";
  graph g = load(model(body, "h"));
  CHECK(g.nodes.size() == 5 + 3 * 3);
  for (int i = 0; i < 3; ++i) {
    // (append, not "h" + to_string: g++ 12 gives a false -Wrestrict warning on the latter)
    std::string pre = std::string("h").append(std::to_string(i)).append(".");
    std::string prev = i == 0 ? "emb" : std::string("h").append(std::to_string(i - 1)).append(".r");
    REQUIRE(g.find(pre + "f") >= 0);
    CHECK(g.nodes[g.find(pre + "f")].inputs == std::vector<int>{g.find(prev)});
    CHECK(g.nodes[g.find(pre + "r")].inputs == std::vector<int>{g.find(prev), g.find(pre + "g")});
    CHECK(g.nodes[g.find(pre + "f")].shape == shape_t{2, 4, 12});
    CHECK(g.nodes[g.find(pre + "g")].line == 11);
  }
  CHECK(g.nodes[g.find("head")].inputs == std::vector<int>{g.find("h2.r")});
}

TEST_CASE("core/graph: expressions") {
  graph_constants c{{"C", graph_value::of_int(768)}, {"NH", graph_value::of_int(12)}, {"L", graph_value::of_int(12)}};
  CHECK(eval_graph_expr("C/NH", c).i == 64);
  CHECK(eval_graph_expr("3*C", c).i == 2304);
  CHECK(eval_graph_expr("2+3*4-(1+1)", c).i == 12);
  CHECK(eval_graph_expr("-C % 5", c).i == -3);
  CHECK(eval_graph_expr(" 1e-5 ", c).to_string() == "1e-05");
  CHECK(eval_graph_expr("0.02/sqrt(2*L)", c).r == doctest::Approx(0.02 / std::sqrt(24.0)));
  CHECK(eval_graph_expr("true", c).to_string() == "true");
  CHECK(eval_graph_expr("'tanh'", c).to_string() == "tanh");
  auto bad = [&](const char* text, const char* part) {
    try {
      eval_graph_expr(text, c);
      FAIL("no error for " << text);
    } catch (const graph_expr_error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
    }
  };
  bad("C/7", "not a whole number");
  bad("4*D", "undefined constant 'D'");
  bad("(C", "missing ')'");
  bad("C C", "unexpected");
  bad("", "empty");
  bad("9223372036854775807*2", "overflow");
  // INT64_MIN / -1 does not fit, and INT64_MIN % -1 trapped (SIGFPE) before it was special-cased.
  bad("(-9223372036854775807-1)/-1", "integer overflow in -9223372036854775808/-1");
  CHECK(eval_graph_expr("(-9223372036854775807-1) % -1", c).i == 0);
  CHECK(eval_graph_expr("(-9223372036854775807-1) / 1", c).i == std::numeric_limits<int64_t>::min());
  bad("pow(2)", "unknown function");
  bad("true*2", "needs numbers");
}

TEST_CASE("core/graph: parse errors give protobuf's line:column") {
  CHECK_ERROR(model(lin_x + "nme: \"oops\"\n"), "m.pbtxt:9:", "parse error", "nme");
  CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\"\n"), "m.pbtxt:9:", "parse error");
}

TEST_CASE("core/graph: unknown op lists the known ones") {
  CHECK_ERROR(model("node { name: \"x\" op: \"lineer\" in: \"emb\" }\n"), "m.pbtxt:8: node 'x'",
              "unknown op 'lineer'", "did you mean 'linear'", "known ops: add, attention");
}

TEST_CASE("core/graph: attribute errors name the node and attribute") {
  SUBCASE("missing") {
    CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\" }\n"), "m.pbtxt:8: node 'x' (linear)",
                "missing attribute 'out'");
  }
  SUBCASE("bad value") {
    CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\"\n attr { key: \"out\" value: \"C/4.0\" } }\n"),
                "m.pbtxt:8: node 'x' (linear)", "'out' must be an integer", "1.5");
  }
  SUBCASE("undefined constant, on the attribute's line") {
    CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\"\n attr { key: \"out\" value: \"4*D\" } }\n"),
                "m.pbtxt:9: node 'x' (linear)", "attribute 'out' \"4*D\"", "undefined constant 'D'");
  }
  SUBCASE("unknown key") {
    CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\" attr { key: \"out\" value: \"C\" }\n"
                      " attr { key: \"init_sdt\" value: \"0.1\" } }\n"),
                "m.pbtxt:9: node 'x' (linear)", "unknown attribute 'init_sdt'", "did you mean 'init_std'");
  }
  SUBCASE("given twice") {
    CHECK_ERROR(model("node { name: \"x\" op: \"linear\" in: \"emb\" attr { key: \"out\" value: \"C\" }\n"
                      " attr { key: \"out\" value: \"V\" } }\n"),
                "m.pbtxt:9: node 'x' (linear)", "'out' given twice");
  }
}

TEST_CASE("core/graph: dangling edge") {
  CHECK_ERROR(model("node { name: \"x\" op: \"linear\"\n in: \"embb\" attr { key: \"out\" value: \"C\" } }\n"),
              "m.pbtxt:9: node 'x' (linear)", "input 'embb' names no node", "did you mean 'emb'");
}

TEST_CASE("core/graph: duplicate edge") {
  CHECK_ERROR(model(lin_x + "node { name: \"y\" op: \"add\" in: \"x\" in: \"x\" }\n", "y"),
              "m.pbtxt:9: node 'y' (add)", "duplicate edge", "'x' is listed twice");
}

TEST_CASE("core/graph: duplicate node name") {
  CHECK_ERROR(model(lin_x + "node { name: \"x\" op: \"gelu\" in: \"emb\" }\n"), "m.pbtxt:9: node 'x' (gelu)",
              "duplicate name", "already defined at line 8");
  CHECK_ERROR(model(lin_x + "block { name: \"x\" repeat: \"1\" input: \"emb\" output: \"a\"\n"
                            " node { name: \"a\" op: \"gelu\" in: \"$in\" } }\n"),
              "m.pbtxt:9: block 'x'", "duplicate name");
}

TEST_CASE("core/graph: cycle names the nodes on it") {
  CHECK_ERROR(model("node { name: \"x\" op: \"add\" in: \"emb\" in: \"z\" }\n"
                    "node { name: \"y\" op: \"gelu\" in: \"x\" }\n"
                    "node { name: \"z\" op: \"gelu\" in: \"y\" }\n"),
              "m.pbtxt:8: node 'x' (add)", "cycle: ", "x -> y -> z -> x");
}

TEST_CASE("core/graph: shape mismatch wraps the op's message") {
  CHECK_ERROR(model(lin_x + "node { name: \"y\" op: \"linear\" in: \"x\" attr { key: \"out\" value: \"3\" } }\n"
                            "node { name: \"z\" op: \"add\" in: \"x\" in: \"y\" }\n", "z"),
              "m.pbtxt:10: node 'z' (add)", "shape mismatch", "add: shapes [2, 4, 6] and [2, 4, 3] differ",
              "'y' [2, 4, 3] f32");
}

TEST_CASE("core/graph: wrong arity") {
  CHECK_ERROR(model("node { name: \"x\" op: \"gelu\" in: \"emb\" in: \"tokens\" }\n"), "m.pbtxt:8: node 'x' (gelu)",
              "wrong arity: takes 1 input, got 2");
}

TEST_CASE("core/graph: declarations") {
  std::string all = "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n";
  for (const char* field : {"tokens", "targets", "logits", "loss"}) {
    std::string decls = all;
    auto at = decls.find(std::string(field) + ": ");
    decls.erase(at, decls.find('"', decls.find('"', at) + 1) + 1 - at);
    // Without tokens: or targets: (and no feed: of its own) that input is fed by nothing.
    const std::string unfed = "input '" + std::string(field) + "' is not fed by anything";
    if (field == std::string("tokens") || field == std::string("targets"))
      CHECK_ERROR(model(lin_x, "x", decls), "m.pbtxt:", unfed.c_str());
    else
      CHECK_ERROR(model(lin_x, "x", decls), "m.pbtxt:1: model", "missing declaration", field);
  }
  CHECK_ERROR(model(lin_x, "x", "tokens: \"tokens\" targets: \"targets\"\nlogits: \"hed\" loss: \"loss\"\n"),
              "m.pbtxt:12: logits", "'hed' names no node");
  CHECK_ERROR(model(lin_x, "x", "tokens: \"emb\" targets: \"targets\" logits: \"head\" loss: \"loss\"\n"),
              "m.pbtxt:11: tokens", "must name an input");
  CHECK_ERROR(model(lin_x, "x", "tokens: \"tokens\" targets: \"targets\" logits: \"head\" loss: \"head\"\n"),
              "m.pbtxt:11: loss", "must be a scalar");
}

TEST_CASE("core/graph: unused nodes are errors") {
  CHECK_ERROR(model(lin_x + "node { name: \"dead\" op: \"gelu\" in: \"x\" }\n"), "m.pbtxt:9: node 'dead' (gelu)",
              "unused");
}

TEST_CASE("core/graph: an input that nothing feeds is an error naming its file and line") {
  // Consumed, so it is no dead end, but the runtime only feeds the tokens and targets inputs.
  std::string extra = "input { name: \"mask\" shape: \"B,T,C\" }\n"
                      "node { name: \"x\" op: \"add\" in: \"emb\" in: \"mask\" }\n";
  CHECK_ERROR(model(extra), "m.pbtxt:8: node 'mask': ", "input 'mask' is not fed by anything",
              "give it feed: \"tokens\", \"targets\", \"images\" or \"labels\"");
  // Unconsumed as well: still reported as unfed (the more basic problem), on its own line.
  CHECK_ERROR(model(lin_x + "\ninput { name: \"spare\" shape: \"B,T\" dtype: I32 }\n"),
              "m.pbtxt:10: node 'spare': ", "input 'spare' is not fed by anything");
  // The tokens and targets inputs themselves are fed under any name.
  std::string renamed = model(lin_x);
  for (auto [from, to] : {std::pair<std::string, std::string>{"\"tokens\"", "\"ids\""}, {"\"targets\"", "\"next\""}})
    for (size_t at; (at = renamed.find(from)) != std::string::npos;) renamed.replace(at, from.size(), to);
  REQUIRE(renamed.find("tokens: \"ids\"") != std::string::npos);
  CHECK_NOTHROW(load(renamed));
}

TEST_CASE("core/graph: block errors") {
  auto block = [](const std::string& repeat, const std::string& out, const std::string& in = "$in") {
    return model("block { name: \"h\" input: \"emb\" output: \"" + out + "\"\n repeat: \"" + repeat +
                     "\"\n node { name: \"a\" op: \"gelu\" in: \"" + in + "\" } }\n", "h");
  };
  CHECK_ERROR(block("0", "a"), "m.pbtxt:9: block 'h'", "repeat must be >= 1, got 0");
  CHECK_ERROR(block("C-7", "a"), "m.pbtxt:9: block 'h'", "repeat must be >= 1, got -1");
  CHECK_ERROR(block("C*C*C*C*C*C", "a"), "m.pbtxt:9: block 'h'", "implausibly large");
  CHECK_ERROR(block("2", "b"), "m.pbtxt:8: block 'h'", "output 'b' is not a node of the block");
  CHECK_ERROR(block("2", "a", "missing"), "m.pbtxt:10: node 'h0.a' (gelu)", "input 'missing' names no node");
  CHECK_ERROR(model("node { name: \"x\" op: \"gelu\" in: \"$in\" }\n"), "m.pbtxt:8: node 'x'",
              "'$in' is only valid inside a block");
}

TEST_CASE("core/graph: constant errors") {
  CHECK_ERROR(model(lin_x + "const { name: \"B\" value: 3 }\n"), "m.pbtxt:9: const 'B'", "reserved");
  CHECK_ERROR(model(lin_x + "const { name: \"C\" value: 3 }\n"), "m.pbtxt:9: const 'C'", "defined twice");
  CHECK_ERROR(model(lin_x + "const { name: \"D\" expr: \"C/E\" }\n"), "m.pbtxt:9: const 'D'",
              "undefined constant 'E'");
}

TEST_CASE("core/graph: bad batch and missing file") {
  CHECK_THROWS_WITH_AS(parse_graph_with(model(lin_x), "m.pbtxt", 0, stubs), doctest::Contains("batch size"),
                       graph_error);
  CHECK_THROWS_WITH_AS(load_graph("/nonexistent/x.pbtxt", 2),
                       doctest::Contains("cannot open model file '/nonexistent/x.pbtxt'"), graph_error);
  // Once: "/tmp:1: model: missing declaration 'loss: ...'".
  CHECK_THROWS_WITH_AS(load_graph("/tmp", 2), "model file '/tmp' is a directory", graph_error);
}

// Parameters of GPT-2 (Radford et al. 2019) from its layer shapes.
int64_t gpt2_params(int64_t V, int64_t T, int64_t C, int64_t L, bool untied_head) {
  int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return V * C + T * C + L * block + 2 * C + (untied_head ? V * C : 0);
}

TEST_CASE("core/graph: the model files load with the real ops") {
  struct spec {
    const char* name;
    int64_t V, T, C, NH, L;
  };
  for (auto m : {spec{"gpt-char-tiny", 64, 64, 64, 4, 2}, spec{"gpt-char-small", 64, 128, 256, 8, 6},
                 spec{"gpt2-124m", 50257, 1024, 768, 12, 12}}) {
    CAPTURE(m.name);
    graph g = load_graph(std::string(FUSION_SOURCE_DIR) + "/configs/models/" + m.name + ".pbtxt", 3);
    CHECK(g.name == m.name);
    // The file's nodes, and a fan-out node after wpe and after every residual add but the last.
    const auto fans = std::count_if(g.nodes.begin(), g.nodes.end(), [](auto& n) { return n.fanout; });
    CHECK(g.nodes.size() - fans == static_cast<size_t>(2 + 2 + 10 * m.L + 3));
    CHECK(fans == 2 * m.L);
    CHECK(g.context == m.T);
    CHECK(g.vocab == m.V);
    CHECK(g.nodes[g.logits_node].shape == shape_t{3, m.T, m.V});
    CHECK(numel_of(g.nodes[g.loss_node].shape) == 1);
    for (int64_t l = 0; l < m.L; ++l) {
      std::string pre = std::string("h").append(std::to_string(l)).append(".");
      REQUIRE(g.find(pre + "attn") >= 0);
      CHECK(g.nodes[g.find(pre + "attn")].attrs.get_int("heads") == m.NH);
      CHECK(g.nodes[g.find(pre + "qkv")].shape == shape_t{3, m.T, 3 * m.C});
      CHECK(g.nodes[g.find(pre + "fc")].shape == shape_t{3, m.T, 4 * m.C});
      CHECK(g.nodes[g.find(pre + "proj")].attrs.get_float("init_std", 0) ==
            doctest::Approx(0.02 / std::sqrt(2.0 * m.L)));
    }
    CHECK(g.find(std::string("h").append(std::to_string(m.L)).append(".ln1")) < 0);
    CHECK(g.nodes[g.find("lnf")].inputs == std::vector<int>{g.find(std::string("h").append(std::to_string(m.L - 1)).append(".res2"))});
    const double expect = static_cast<double>(gpt2_params(m.V, m.T, m.C, m.L, true));
    CHECK(std::abs(static_cast<double>(g.param_count()) - expect) <= 0.01 * expect);
    if (m.V == 50257)  // "124M" is the tied count; our lm_head is untied (docs/model-format.md)
      CHECK(std::abs(static_cast<double>(g.param_count()) - (124e6 + 50257.0 * 768)) <= 0.01 * 124e6);
  }
}

}  // namespace
}  // namespace fusion
