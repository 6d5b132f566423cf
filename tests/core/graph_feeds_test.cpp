// What feeds a model's inputs: `feed:` on an input or the older `tokens:` / `targets:`; a text
// model is fed tokens and targets, an image classifier images and labels, never a mix.
#include <doctest/doctest.h>

#include <string>

#include "core/graph.hpp"
#include "tests/support/graph_errors.hpp"

using namespace fusion;

namespace {

// A classifier over (B, 1, 4, 4) images; `inputs` replaces the two input lines.
std::string classifier(const std::string& inputs, const std::string& tail = "loss: \"loss\"\n") {
  return "name: \"c\"\n" + inputs +
         "node { name: \"pool\" op: \"global_avg_pool\" in: \"x\" }\n"
         "node { name: \"fc\" op: \"linear\" in: \"pool\" attr { key: \"out\" value: \"10\" } }\n"
         "node { name: \"loss\" op: \"cross_entropy\" in: \"fc\" in: \"y\" }\n" +
         tail;
}

const std::string image_inputs = "input { name: \"x\" shape: \"B,1,4,4\" feed: \"images\" }\n"
                                 "input { name: \"y\" shape: \"B\" dtype: I32 feed: \"labels\" }\n";

std::string error_of(const std::string& text) { return test::graph_error_of([&] { parse_graph(text, "m.pbtxt", 3); }); }

}  // namespace

TEST_CASE("core/graph feeds: an image classifier is fed images and labels, logits optional") {
  graph g = parse_graph(classifier(image_inputs), "m.pbtxt", 3);
  CHECK_FALSE(g.is_text());
  REQUIRE(g.feeds.size() == 2);
  CHECK(g.feeds[0].feed == "images");
  CHECK(g.nodes[g.feeds[0].node].name == "x");
  CHECK(g.feeds[1].feed == "labels");
  CHECK(g.nodes[g.feeds[1].node].name == "y");
  CHECK(g.logits_node == -1);
  CHECK(g.tokens_node == -1);
  CHECK(g.row_items == 1);
  CHECK(g.context == 0);
  graph h = parse_graph(classifier(image_inputs, "loss: \"loss\" logits: \"fc\"\n"), "m.pbtxt", 3);
  CHECK(h.nodes[h.logits_node].name == "fc");
}

TEST_CASE("core/graph feeds: wrong, missing, repeated or mixed feeds are errors naming the line") {
  CHECK(error_of(classifier("input { name: \"x\" shape: \"B,1,4,4\" feed: \"pixels\" }\n"
                            "input { name: \"y\" shape: \"B\" dtype: I32 feed: \"labels\" }\n"))
            .find("m.pbtxt:2: input 'x': unknown feed 'pixels'") == 0);
  CHECK(error_of(classifier("input { name: \"x\" shape: \"B,1,4,4\" feed: \"images\" }\n"
                            "input { name: \"y\" shape: \"B\" dtype: I32 feed: \"images\" }\n"))
            .find("m.pbtxt:3: input 'y': feed 'images' is already given to input 'x' (line 2)") == 0);
  CHECK(error_of(classifier("input { name: \"x\" shape: \"B,1,4,4\" feed: \"images\" }\n"
                            "input { name: \"y\" shape: \"B\" dtype: I32 }\n"))
            .find("m.pbtxt:3: node 'y': input 'y' is not fed by anything") == 0);
  CHECK(error_of(classifier("input { name: \"x\" shape: \"B,1,4,4\" feed: \"images\" }\n"
                            "input { name: \"y\" shape: \"B\" dtype: I32 feed: \"targets\" }\n"))
            .find("m.pbtxt:1: model: mixes text feeds") == 0);
  // The right feeds on tensors the ops accept but a data source cannot fill.
  const std::string flat = "name: \"f\"\ninput { name: \"x\" shape: \"B,16\" feed: \"images\" }\n"
                           "input { name: \"y\" shape: \"B\" dtype: I32 feed: \"labels\" }\n"
                           "node { name: \"fc\" op: \"linear\" in: \"x\" attr { key: \"out\" value: \"10\" } }\n"
                           "node { name: \"loss\" op: \"cross_entropy\" in: \"fc\" in: \"y\" }\nloss: \"loss\"\n";
  CHECK(error_of(flat).find("m.pbtxt:2: input 'x': input 'x' must be F32 with shape (B, C, H, W) = [3, C, H, W], "
                            "got [3, 16] f32") == 0);
  const std::string per_pixel =
      "name: \"p\"\ninput { name: \"x\" shape: \"B,1,4,4\" feed: \"images\" }\n"
      "input { name: \"y\" shape: \"B,1,4\" dtype: I32 feed: \"labels\" }\n"
      "node { name: \"fc\" op: \"linear\" in: \"x\" attr { key: \"out\" value: \"10\" } }\n"
      "node { name: \"loss\" op: \"cross_entropy\" in: \"fc\" in: \"y\" }\nloss: \"loss\"\n";
  CHECK(error_of(per_pixel).find("m.pbtxt:3: input 'y': input 'y' must be I32 class ids with shape (B) = [3]") == 0);
  // logits of a classifier are (B, classes).
  CHECK(error_of(classifier(image_inputs, "loss: \"loss\"\nlogits: \"x\"\n"))
            .find("m.pbtxt:8: logits: node 'x' has shape [3, 1, 4, 4], expected (B, classes)") == 0);
}

TEST_CASE("core/graph feeds: feed: \"tokens\" equals the model-level tokens: declaration") {
  const std::string body =
      "node { name: \"emb\" op: \"token_embedding\" in: \"t\" attr { key: \"vocab\" value: \"8\" } attr { key: \"dim\" value: \"4\" } }\n"
      "node { name: \"head\" op: \"linear\" in: \"emb\" attr { key: \"out\" value: \"8\" } }\n"
      "node { name: \"loss\" op: \"cross_entropy\" in: \"head\" in: \"u\" }\n"
      "logits: \"head\" loss: \"loss\"\n";
  graph a = parse_graph("name: \"a\"\ninput { name: \"t\" shape: \"B,5\" dtype: I32 feed: \"tokens\" }\n"
                        "input { name: \"u\" shape: \"B,5\" dtype: I32 feed: \"targets\" }\n" + body,
                        "a.pbtxt", 2);
  graph b = parse_graph("name: \"b\"\ninput { name: \"t\" shape: \"B,5\" dtype: I32 }\n"
                        "input { name: \"u\" shape: \"B,5\" dtype: I32 }\n" + body + "tokens: \"t\" targets: \"u\"\n",
                        "b.pbtxt", 2);
  for (const graph* g : {&a, &b}) {
    CHECK(g->is_text());
    CHECK(g->context == 5);
    CHECK(g->row_items == 5);
    CHECK(g->vocab == 8);
    CHECK(g->nodes[g->tokens_node].name == "t");
    CHECK(g->nodes[g->targets_node].name == "u");
  }
  // Both spellings at once must agree.
  CHECK(error_of("name: \"c\"\ninput { name: \"t\" shape: \"B,5\" dtype: I32 feed: \"targets\" }\n"
                 "input { name: \"u\" shape: \"B,5\" dtype: I32 }\n" + body + "tokens: \"t\" targets: \"u\"\n")
            .find("tokens: input 't' already has feed: \"targets\"") != std::string::npos);
}
