// Model-file templates (docs/model-format.md, "Templates"): expansion, names and per-block args,
// empty blocks, one test per error (file, line and what is named), and the ResNet model files
// against torchvision's parameter counts and multiply-adds.
//
// The template tests use the real ops of a tiny text model (linear, add: shape inference only,
// nothing runs); the ResNet tests load configs/models/resnet*.pbtxt with the real image ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/graph_loader.hpp"
#include "tests/support/graph_errors.hpp"
#include "tests/support/op_tables.hpp"

namespace fusion {
namespace {

// A valid text model with `body` starting at line 8; `last` is the node feeding the head.
std::string model(const std::string& body, const std::string& last) {
  return "name: \"m\"\n"
         "const { name: \"V\" value: 8 }\n"
         "const { name: \"T\" value: 4 }\n"
         "const { name: \"C\" value: 6 }\n"
         "input { name: \"tokens\" shape: \"B,T\" dtype: I32 feed: \"tokens\" }\n"
         "input { name: \"targets\" shape: \"B,T\" dtype: I32 feed: \"targets\" }\n"
         "node { name: \"emb\" op: \"token_embedding\" in: \"tokens\" attr { key: \"vocab\" value: \"V\" }"
         " attr { key: \"dim\" value: \"C\" } }\n" +
         body + "node { name: \"head\" op: \"linear\" in: \"" + last + "\" attr { key: \"out\" value: \"V\" } }\n" +
         "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"targets\" }\n"
         "logits: \"head\" loss: \"loss\"\n";
}

// Lines 8-12: a residual MLP template with two params.
const std::string mlp =
    "template { name: \"mlp\" param: \"W\" param: \"S\" output: \"r\"\n"
    "  node { name: \"f\" op: \"linear\" in: \"$in\" attr { key: \"out\" value: \"W\" } }\n"
    "  node { name: \"g\" op: \"linear\" in: \"f\" attr { key: \"out\" value: \"C\" }"
    " attr { key: \"init_std\" value: \"S\" } }\n"
    "  node { name: \"r\" op: \"add\" in: \"$in\" in: \"g\" }\n"
    "}\n";

// A block using mlp; `extra` goes before the closing brace.
std::string use_mlp(const std::string& name, const std::string& repeat, const std::string& input,
                    const std::string& w = "C", const std::string& s = "0.1", const std::string& extra = "") {
  return "block { name: \"" + name + "\" use: \"mlp\" repeat: \"" + repeat + "\" input: \"" + input +
         "\" arg { key: \"W\" value: \"" + w + "\" } arg { key: \"S\" value: \"" + s + "\" }" + extra + " }\n";
}

// Template expansion without the loader's fan-out nodes: these tests check the names and order
// the file's nodes get.
graph load(const std::string& text) { return parse_graph_with(text, "m.pbtxt", 2, test::op_table_without_fanouts()); }

std::string error_of(const std::string& text) { return test::graph_error_of([&] { load(text); }); }

#define CHECK_ERROR CHECK_GRAPH_ERROR

std::vector<int> ids(const graph& g, std::initializer_list<const char*> names) {
  std::vector<int> out;
  for (auto* n : names) out.push_back(g.find(n));
  return out;
}

// The nodes `name` reads, looking through fan-out nodes to the ops they follow.
std::vector<int> sources(const graph& g, const char* name) {
  std::vector<int> out;
  for (int p : g.nodes[g.find(name)].inputs) out.push_back(g.nodes[p].fanout ? g.nodes[p].inputs[0] : p);
  return out;
}

TEST_CASE("core/graph_template: blocks expand a template with their own args and the usual names") {
  graph g = load(model(mlp + use_mlp("a", "2", "emb", "2*C", "0.5") + use_mlp("b", "1", "a", "C+1", "0.25"), "b"));
  const char* names[] = {"tokens", "targets", "emb",  "a0.f", "a0.g", "a0.r", "a1.f",
                         "a1.g",   "a1.r",    "b0.f", "b0.g", "b0.r", "head", "loss"};
  REQUIRE(g.nodes.size() == std::size(names));
  for (size_t i = 0; i < g.nodes.size(); ++i) CHECK(g.nodes[i].name == names[i]);
  // W per block, S per block; C (a file constant) inside the template.
  CHECK(g.nodes[g.find("a0.f")].shape == shape_t{2, 4, 12});
  CHECK(g.nodes[g.find("a1.f")].shape == shape_t{2, 4, 12});
  CHECK(g.nodes[g.find("b0.f")].shape == shape_t{2, 4, 7});
  CHECK(g.nodes[g.find("a0.g")].shape == shape_t{2, 4, 6});
  CHECK(g.nodes[g.find("a1.g")].attrs.get_float("init_std", 0) == doctest::Approx(0.5));
  CHECK(g.nodes[g.find("b0.g")].attrs.get_float("init_std", 0) == doctest::Approx(0.25));
  // $in chains through the instances and on into the next block; the block names alias.
  CHECK(g.nodes[g.find("a0.f")].inputs == ids(g, {"emb"}));
  CHECK(g.nodes[g.find("a1.f")].inputs == ids(g, {"a0.r"}));
  CHECK(g.nodes[g.find("a1.r")].inputs == ids(g, {"a0.r", "a1.g"}));
  CHECK(g.nodes[g.find("b0.f")].inputs == ids(g, {"a1.r"}));
  CHECK(g.nodes[g.find("head")].inputs == ids(g, {"b0.r"}));
  // Nodes keep the template's lines.
  CHECK(g.nodes[g.find("a1.f")].line == 9);
  CHECK(g.nodes[g.find("b0.g")].line == 10);
}

TEST_CASE("core/graph_template: params shadow file constants, args see only the file's constants") {
  // The block comes before the template: templates are not in file order. The param C shadows
  // the file's C inside the template; the arg "2*C" reads the file's C = 6.
  std::string body = "block { name: \"w\" use: \"wide\" repeat: \"2\" input: \"emb\""
                     " arg { key: \"C\" value: \"2*C\" } }\n"
                     "template { name: \"wide\" param: \"C\" output: \"f\"\n"
                     "  node { name: \"f\" op: \"linear\" in: \"$in\" attr { key: \"out\" value: \"C+V\" } } }\n";
  graph g = load(model(body, "w"));
  CHECK(g.nodes[g.find("w0.f")].shape == shape_t{2, 4, 20});
  CHECK(g.nodes[g.find("w1.f")].shape == shape_t{2, 4, 20});
  CHECK(g.nodes[g.find("emb")].shape == shape_t{2, 4, 6});
  CHECK(g.nodes[g.find("w1.f")].line == 10);
  // An arg cannot read another param.
  CHECK_ERROR(model(mlp + "block { name: \"a\" use: \"mlp\" repeat: \"1\" input: \"emb\""
                          " arg { key: \"W\" value: \"C\" }\n arg { key: \"S\" value: \"W\" } }\n", "a"),
              "m.pbtxt:14: block 'a': ", "arg 'S' \"W\"", "undefined constant 'W'");
}

TEST_CASE("core/graph_template: a template block may repeat 0 times and then stands for its input") {
  SUBCASE("chained empty blocks") {
    graph g = load(model(mlp + use_mlp("a", "C-6", "emb") + use_mlp("b", "0", "a") + use_mlp("c", "1", "b"), "c"));
    CHECK(g.nodes.size() == 5 + 3);
    CHECK(g.find("a0.f") < 0);
    CHECK(g.nodes[g.find("c0.f")].inputs == ids(g, {"emb"}));
  }
  SUBCASE("named by a declaration and naming a later node") {
    graph g = load(model(mlp + use_mlp("e", "0", "x") + "node { name: \"x\" op: \"gelu\" in: \"emb\" }\n", "e"));
    CHECK(g.nodes[g.find("head")].inputs == ids(g, {"x"}));
  }
  SUBCASE("errors") {
    CHECK_ERROR(model(mlp + use_mlp("e", "0", "nope"), "e"), "m.pbtxt:13: block 'e': ", "input 'nope' names no node");
    CHECK_ERROR(model(mlp + use_mlp("e", "0", "f"), "e"), "m.pbtxt:13: block 'e': ", "input 'f' names no node");
    CHECK_ERROR(model(mlp + use_mlp("e", "0", "") , "e"), "m.pbtxt:13: block 'e': ", "uses '$in' but has no 'input'");
    CHECK_ERROR(model(mlp + use_mlp("p", "0", "q") + use_mlp("q", "0", "p"), "q"), "m.pbtxt:13: block 'p': ",
                "in a cycle");
    CHECK_ERROR(model(mlp + "block { name: \"e\" use: \"mlp\" input: \"emb\" arg { key: \"W\" value: \"C\" }"
                            " arg { key: \"S\" value: \"0.1\" }\n repeat: \"C-7\" }\n", "e"),
                "m.pbtxt:14: block 'e': ", "repeat must be >= 0, got -1");
    // Listed nodes never repeat 0 times: they would be dead text.
    CHECK_ERROR(model("block { name: \"h\" input: \"emb\" output: \"a\" repeat: \"0\"\n"
                      " node { name: \"a\" op: \"gelu\" in: \"$in\" } }\n", "h"),
                "m.pbtxt:8: block 'h': ", "repeat must be >= 1, got 0", "only a block with use: may repeat 0 times");
  }
}

TEST_CASE("core/graph_template: unknown template") {
  CHECK_ERROR(model(mlp + "block { name: \"a\" repeat: \"1\" input: \"emb\"\n use: \"mpl\" }\n", "a"),
              "m.pbtxt:14: block 'a': ", "unknown template 'mpl'", "did you mean 'mlp'", "templates: mlp");
  CHECK_ERROR(model("block { name: \"a\" use: \"mlp\" repeat: \"1\" input: \"emb\" }\n", "a"), "m.pbtxt:8: block 'a': ",
              "unknown template 'mlp'", "the file defines no templates");
}

TEST_CASE("core/graph_template: args: missing, unknown, given twice, without use, bad value") {
  CHECK_ERROR(model(mlp + "block { name: \"a\" use: \"mlp\" repeat: \"1\" input: \"emb\""
                          " arg { key: \"W\" value: \"C\" } }\n", "a"),
              "m.pbtxt:13: block 'a': ", "missing arg 'S' for template 'mlp' (line 8)", "its params: W, S");
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "C", "0.1", "\n arg { key: \"WW\" value: \"2\" }"), "a"),
              "m.pbtxt:14: block 'a': ", "unknown arg 'WW'", "did you mean 'W'", "its params: W, S");
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "C", "0.1", "\n arg { key: \"W\" value: \"2\" }"), "a"),
              "m.pbtxt:14: block 'a': ", "arg 'W' given twice");
  CHECK_ERROR(model("block { name: \"h\" repeat: \"1\" input: \"emb\" output: \"a\"\n"
                    " arg { key: \"W\" value: \"2\" }\n node { name: \"a\" op: \"gelu\" in: \"$in\" } }\n", "h"),
              "m.pbtxt:9: block 'h': ", "arg 'W' without 'use'");
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "4*D"), "a"), "m.pbtxt:13: block 'a': ", "arg 'W' \"4*D\"",
              "undefined constant 'D'");
}

TEST_CASE("core/graph_template: a block with use lists no nodes and no output") {
  const std::string own_node = "\n node { name: \"x\" op: \"gelu\" in: \"$in\" }";
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "C", "0.1", own_node), "a"),
              "m.pbtxt:14: block 'a': ", "lists nodes and uses template 'mlp' (line 8)");
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "C", "0.1", "\n output: \"r\""), "a"), "m.pbtxt:14: block 'a': ",
              "'output' comes from template 'mlp'");
}

TEST_CASE("core/graph_template: template definition errors") {
  auto tpl = [](const std::string& inner) {
    return model("template { name: \"t\"\n" + inner + " }\n" + mlp + use_mlp("a", "1", "emb"), "a");
  };
  const std::string node = "node { name: \"x\" op: \"gelu\" in: \"$in\" }\n";
  CHECK_ERROR(tpl("param: \"B\" output: \"x\" " + node), "m.pbtxt:9: template 't': ", "param 'B'",
              "B is reserved");
  CHECK_ERROR(tpl("param: \"W\"\n param: \"W\" output: \"x\" " + node), "m.pbtxt:10: template 't': ",
              "param 'W' listed twice");
  CHECK_ERROR(tpl("param: \"2x\" output: \"x\" " + node), "m.pbtxt:9: template 't': ", "param '2x'",
              "bad constant name");
  CHECK_ERROR(tpl("output: \"x\""), "m.pbtxt:8: template 't': ", "has no nodes");
  CHECK_ERROR(tpl(node), "m.pbtxt:8: template 't': ", "missing 'output'");
  CHECK_ERROR(tpl("output: \"xx\" " + node), "m.pbtxt:9: template 't': ", "output 'xx' is not a node of the template",
              "did you mean 'x'");
  CHECK_ERROR(model(mlp + mlp + use_mlp("a", "1", "emb"), "a"), "m.pbtxt:13: template 'mlp': ",
              "defined twice (first at line 8)");
  CHECK_ERROR(model("template { name: \"a.b\" output: \"x\" " + node + "}\n", "emb"), "m.pbtxt:8: template 'a.b': ",
              "bad template name");
}

TEST_CASE("core/graph_template: errors inside an instance name the instance and the template's line") {
  std::string bad = mlp;
  bad.replace(bad.find("value: \"S\""), 10, "value: \"S2\"");
  CHECK_ERROR(model(bad + use_mlp("a", "1", "emb"), "a"), "m.pbtxt:10: node 'a0.g' (linear): ",
              "attribute 'init_std' \"S2\"", "undefined constant 'S2'", "did you mean 'S'");
  // Block b reads a0.f, 2C wide: its residual add sees different widths, reported for b0.
  CHECK_ERROR(model(mlp + use_mlp("a", "1", "emb", "2*C") + use_mlp("b", "1", "a0.f"), "b"),
              "m.pbtxt:11: node 'b0.r' (add): ", "shape mismatch");
}

// Multiply-adds per image of the conv2d and linear nodes, from the loaded shapes: the measure
// torchvision publishes as "GFLOPS" (1.81, 4.09, 7.80 for ResNet-18, -50, -101).
int64_t macs_per_image(const graph& g) {
  int64_t macs = 0;
  for (auto& n : g.nodes) {
    if (n.kind != "conv2d" && n.kind != "linear") continue;
    const shape_t& in = g.nodes[n.inputs[0]].shape;
    const int64_t k = n.kind == "conv2d" ? n.attrs.get_int("kernel") : 1;
    macs += numel_of(n.shape) / g.batch * (n.kind == "conv2d" ? in[1] : in.back()) * k * k;
  }
  return macs;
}

struct resnet_spec {
  const char* file;
  int64_t params;            // torchvision's for the ImageNet files; from the layer shapes otherwise
  int64_t macs;              // conv and linear multiply-adds per image
  bool bottleneck;
  std::vector<int> depth;    // blocks per stage
  int64_t classes, hw, last_hw;
  bool imagenet_stem;
};

// Nodes of the expanded graph: 2 inputs, the stem, the blocks, global pool, fc and loss.
size_t node_count(const resnet_spec& m) {
  const size_t plain = m.bottleneck ? 10 : 7, down = plain + 2;  // down: projection conv + batchnorm
  size_t n = 2 + (m.imagenet_stem ? 4 : 3) + 3;
  for (size_t s = 0; s < m.depth.size(); ++s)
    n += (s == 0 && !m.bottleneck) ? m.depth[s] * plain : down + (m.depth[s] - 1) * plain;
  return n;
}

TEST_CASE("core/graph_template: the ResNet files load with torchvision's parameter counts") {
  // Parameter counts and multiply-adds of the ImageNet files equal torchvision's resnet18/50/101
  // (conv weights, batchnorm weight and bias, fc weight and bias; running statistics are
  // buffers). The small and fmnist counts follow from the same layer shapes.
  const std::vector<resnet_spec> specs = {
      {"resnet18", 11689512, 1814073344, false, {2, 2, 2, 2}, 1000, 224, 7, true},
      {"resnet50", 25557032, 4089184256, true, {3, 4, 6, 3}, 1000, 224, 7, true},
      {"resnet101", 44549160, 7801405440, true, {3, 4, 23, 3}, 1000, 224, 7, true},
      {"resnet18-small", 11172810, 455800832, false, {2, 2, 2, 2}, 10, 28, 4, false},
      {"resnet50-small", 23519690, 1046819840, true, {3, 4, 6, 3}, 10, 28, 4, false},
      {"resnet101-small", 42511818, 1974875136, true, {3, 4, 23, 3}, 10, 28, 4, false},
      {"resnet-fmnist", 77754, 9345920, false, {1, 1, 1}, 10, 28, 7, false},
  };
  for (auto& m : specs) {
    CAPTURE(m.file);
    graph g = load_graph(std::string(FUSION_SOURCE_DIR) + "/configs/models/" + m.file + ".pbtxt", 2);
    CHECK(g.name == m.file);
    CHECK(g.param_count() == m.params);
    CHECK(macs_per_image(g) == m.macs);
    CHECK(std::count_if(g.nodes.begin(), g.nodes.end(), [](auto& n) { return !n.fanout; }) ==
          static_cast<std::ptrdiff_t>(node_count(m)));
    CHECK_FALSE(g.is_text());
    REQUIRE(g.feeds.size() == 2);
    CHECK(g.nodes[g.feeds[0].node].shape == shape_t{2, m.imagenet_stem ? 3 : 1, m.hw, m.hw});
    CHECK(g.nodes[g.feeds[1].node].shape == shape_t{2});
    REQUIRE(g.logits_node >= 0);
    CHECK(g.nodes[g.logits_node].name == "fc");
    CHECK(g.nodes[g.logits_node].shape == shape_t{2, m.classes});
    CHECK(g.nodes[g.loss_node].name == "loss");
    const int64_t out_channels = (m.bottleneck ? 4 : 1) * (m.depth.size() == 4 ? 512 : 64);
    CHECK(g.nodes[g.find("gap")].inputs.size() == 1);
    CHECK(g.nodes[g.nodes[g.find("gap")].inputs[0]].shape == shape_t{2, out_channels, m.last_hw, m.last_hw});
    // Stage 2 starts with the down block: the stride on c1 (basic) or c2 (bottleneck, v1.5) and
    // on the projection.
    const char* strided = m.bottleneck ? "s2a0.c2" : "s2a0.c1";
    REQUIRE(g.find(strided) >= 0);
    CHECK(g.nodes[g.find(strided)].attrs.get_int("stride", 1) == 2);
    CHECK(g.nodes[g.find("s2a0.proj")].attrs.get_int("stride", 1) == 2);
    CHECK(g.nodes[g.find(m.bottleneck ? "s2a0.c1" : "s2a0.c2")].attrs.get_int("stride", 1) == 1);
  }
  // The last instance of ResNet-101's long stage 3, and nothing beyond it.
  graph g = load_graph(std::string(FUSION_SOURCE_DIR) + "/configs/models/resnet101.pbtxt", 2);
  CHECK(g.find("s3b21.out") >= 0);
  CHECK(g.find("s3b22.c1") < 0);
  CHECK(sources(g, "s4a0.c1") == ids(g, {"s3b21.out"}));
}

TEST_CASE("core/graph_template: resnet-fmnist's stages follow N") {
  // With N = 1 the "b" blocks are empty; with N = 3 each stage has three blocks.
  std::ifstream in(std::string(FUSION_SOURCE_DIR) + "/configs/models/resnet-fmnist.pbtxt");
  std::stringstream text;
  text << in.rdbuf();
  std::string src = text.str();
  graph one = parse_graph(src, "resnet-fmnist.pbtxt", 2);
  CHECK(sources(one, "s3a0.c1") == ids(one, {"s2a0.out"}));
  const std::string n1 = "const { name: \"N\"  value: 1 }";
  REQUIRE(src.find(n1) != std::string::npos);
  src.replace(src.find(n1), n1.size(), "const { name: \"N\"  value: 3 }");
  graph three = parse_graph(src, "resnet-fmnist.pbtxt", 2);
  CHECK(sources(three, "s3a0.c1") == ids(three, {"s2b1.out"}));
  CHECK(three.find("s3b1.out") >= 0);
  CHECK(three.param_count() > 2 * one.param_count());
}

}  // namespace
}  // namespace fusion
