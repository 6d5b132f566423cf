// Refused inputs as a user meets them (issue 34): the exit codes of docs/training.md in every
// program (the same bad cluster file exits 1 from fusion-train and from fusion-cluster check), a
// plan that does not fit its nodes' memory refused naming the node, and cluster and profile file
// errors in plain words naming the file, line and field, never the protobuf or JSON library's
// own text.
#include <doctest/doctest.h>

#include <string>

#include "tests/support/fixtures.hpp"

namespace {

using namespace fusion::test;

std::string prog(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Neither library's wording reaches the user.
void check_no_library_text(const std::string& out) {
  for (const char* word : {"Message type", "fusion.pb", "has no field named", "json.exception", "syntax error",
                           "last read", "parse_error"})
    CHECK_MESSAGE(!contains(out, word), "'" << word << "' in: " << out);
}

// A cluster file whose node misspells `site` on line 4.
const char* misspelt_cluster =
    "name: \"bad\"\n"
    "site { name: \"a\" }\n"
    "site { name: \"b\" }\n"
    "node { name: \"a1\" sitte: \"a\" }\n"
    "node { name: \"b1\" site: \"b\" }\n";

}  // namespace

TEST_CASE("apps/input errors: the same bad cluster file exits 1 from fusion-train and fusion-cluster check") {
  scratch_dir d("input_errors", "cluster");
  write_file(d / "bad.pbtxt", misspelt_cluster);
  const std::string file = (d / "bad.pbtxt").string();
  const std::string says = file + ":4:19: parse error: unknown field 'sitte' in 'node { }' (did you mean 'site'?)";
  auto check = run_in_source(prog("fusion-cluster") + " check " + file);
  INFO(check.output);
  CHECK(check.status == 1);
  CHECK(contains(check.output, "fusion-cluster: " + says));
  check_no_library_text(check.output);
  for (const std::string& args : {" netns " + file, " plan " + file + " --model configs/models/gpt-char-tiny.pbtxt"}) {
    auto r = run_in_source(prog("fusion-cluster") + args);
    INFO(args << "\n" << r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, says));
  }
  auto train = run_in_source(prog("fusion-train") + " --config configs/runs/char-tiny.ini --cluster " + file +
                             " --security.mode=off --output.metrics= --output.checkpoint= --runtime.quiet");
  INFO(train.output);
  CHECK(train.status == 1);
  CHECK(contains(train.output, says));
  check_no_library_text(train.output);
}

TEST_CASE("apps/input errors: fusion-cluster plan --cluster.policy even refuses nodes too small for the model") {
  scratch_dir d("input_errors", "small");
  write_file(d / "small.pbtxt",
             "name: \"small\"\n"
             "site { name: \"a\" }\n"
             "site { name: \"b\" }\n"
             "node { name: \"a1\" site: \"a\" device: \"cpu\" gflops: 100 memory_gib: 0.001 }\n"
             "node { name: \"b1\" site: \"b\" device: \"cpu\" gflops: 100 memory_gib: 0.001 }\n"
             "link { a: \"a\" b: \"b\" mbit: 100 }\n");
  const std::string plan = prog("fusion-cluster") + " plan " + (d / "small.pbtxt").string() +
                           " --model configs/models/gpt-char-small.pbtxt";
  auto even = run_in_source(plan + " --cluster.policy even");
  INFO(even.output);
  CHECK(even.status == 1);
  CHECK(contains(even.output, "small.pbtxt: model 'gpt-char-small' does not fit with policy even: node 'a1' has 1.0 MiB "
                              "of memory, and its stage 0 ("));
  CHECK_FALSE(contains(even.output, "predicted step"));  // no impossible plan printed
  // OP-Fence refuses it too, in its own words; --json prints nothing either.
  auto fence = run_in_source(plan + " --json");
  INFO(fence.output);
  CHECK(fence.status == 1);
  CHECK(contains(fence.output, "does not fit in memory"));
  CHECK_FALSE(contains(fence.output, "{"));
}

TEST_CASE("apps/input errors: a malformed profile file is said in plain words with the line and column") {
  scratch_dir d("input_errors", "profile");
  const std::string plan = prog("fusion-cluster") + " plan configs/clusters/sites-3.pbtxt --model "
                                                    "configs/models/gpt-char-small.pbtxt --cluster.profile " +
                           (d / "p.json").string();
  const std::pair<const char*, const char*> cases[] = {
      {"{\n  \"format\": \"fusion-profile\",\n  \"nodes\": { oops }\n}\n",
       "p.json: malformed JSON at line 3, column 14: found 'o' where a key in double quotes belongs"},
      {"{\"format\": \"fusion-profile\", \"version\": 1, \"nodes\": {}} }",
       "found '}' where the end of the file (the JSON object has ended) belongs"},
      {"{\"format\": \"fusion-profile\", \"version\": 1, \"nodes\": {\"a1\": ",
       "found the end of the file where a value (a number, a string in double quotes"},
  };
  for (auto [text, says] : cases) {
    write_file(d / "p.json", text);
    auto r = run_in_source(plan);
    INFO(text << "\n" << r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, says));
    check_no_library_text(r.output);
  }
}
