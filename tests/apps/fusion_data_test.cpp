// fusion-data's command line as a user meets it: help on stdout, usage mistakes and bad input
// exiting 2, bad input exiting 1, each with a plain message that names the file and offset.
#include <doctest/doctest.h>

#include <string>

#include "core/token_shard.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using namespace fusion::test;

namespace {

std::string fusion_data() { return std::string(FUSION_BINARY_DIR) + "/apps/fusion-data"; }

bool has(const run_result& r, const std::string& part) { return r.output.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("apps/fusion-data: help, usage mistakes and bad input") {
  scratch_dir d("fusion_data", "cli");
  auto r = run_in(d.path.string(), fusion_data() + " --help 2>/dev/null");
  CHECK(r.status == 0);
  CHECK(has(r, "train-bpe"));
  CHECK(has(r, "tokenize"));
  r = run_in(d.path.string(), fusion_data() + " tokenize --out x a.txt");
  CHECK(r.status == 2);
  CHECK(has(r, "tokenize needs --tokenizer DIR"));
  r = run_in(d.path.string(), fusion_data() + " train-bpe a.txt --vocab-size 100 --out tok");
  CHECK(r.status == 2);
  CHECK(has(r, "--vocab-size needs an integer >= 257, got '100'"));
  r = run_in(d.path.string(), fusion_data() + " train-bpe a.txt --vocab-size 300 --out tok --bogus 1");
  CHECK(r.status == 2);
  CHECK(has(r, "unknown option '--bogus' for train-bpe"));
  r = run_in(d.path.string(), fusion_data() + " frobnicate");
  CHECK(r.status == 2);
  CHECK(has(r, "unknown command 'frobnicate'"));
  r = run_in(d.path.string(), fusion_data() + " train-bpe missing.txt --vocab-size 300 --out tok");
  CHECK(r.status == 1);  // a refused input, as in fusion-train (docs/training.md, "Exit status")
  CHECK(has(r, "missing.txt"));
  // A shard that is cut short, checked: the file and the offset where it ends.
  std::vector<int32_t> toks = {1, 2, 3, 4};
  write_token_shard((d / "a_train.bin").string(), toks, 2);
  std::filesystem::resize_file(d / "a_train.bin", 1024 + 5);
  r = run_in(d.path.string(), fusion_data() + " check a_train.bin");
  CHECK(r.status == 1);
  CHECK(has(r, "a_train.bin: offset 1029: the header says 4 tokens"));
  // A tokenizer whose merges name a token its vocabulary lacks.
  write_file(d / "corpus.txt", "the cat sat on the mat, the cat sat on the hat\n");
  REQUIRE(run_in(d.path.string(), fusion_data() + " train-bpe corpus.txt --vocab-size 270 --out tok").status == 0);
  write_file(d / "tok/merges.txt", read_file(d / "tok/merges.txt") + "Ġdog Ġcat\n");
  r = run_in(d.path.string(), fusion_data() + " tokenize --tokenizer tok corpus.txt --out shards");
  CHECK(r.status == 1);
  CHECK(has(r, "tok/merges.txt:"));
  CHECK(has(r, "\"Ġdog\" is not in"));
}
