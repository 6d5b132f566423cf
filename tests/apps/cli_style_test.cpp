// One command-line style in every program (issue 34): the programs of commands share
// cli::command_program (apps/cli.hpp), so a misspelt command or option gets a did-you-mean
// everywhere, fusion-cluster's options are named as fusion-train's settings, an old spelling
// says its new one, and every --help shows defaults and two examples.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/fixtures.hpp"

namespace {

using fusion::test::run_in_source;

std::string prog(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct mistake {
  std::string command, says;
};

}  // namespace

TEST_CASE("apps/cli: did-you-mean for misspelt commands and options in every program, exit 2") {
  const std::vector<mistake> mistakes = {
      {"fusion-cluster chek configs/clusters/sites-3.pbtxt",
       "fusion-cluster: unknown command 'chek' (did you mean 'check'?); commands: check, plan, netns or certs"},
      {"fusion-data tokenise a.txt", "fusion-data: unknown command 'tokenise' (did you mean 'tokenize'?)"},
      {"fusion-probe mesure 127.0.0.1:1", "fusion-probe: unknown command 'mesure' (did you mean 'measure'?)"},
      {"fusion-admin 127.0.0.1:1 wach", "fusion-admin: unknown command 'wach' (did you mean 'watch'?)"},
      {"fusion-cluster plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-tiny.pbtxt --train.bacth 8",
       "unknown option '--train.bacth' for plan (did you mean '--train.batch'?)"},
      {"fusion-cluster certs configs/clusters/sites-3.pbtxt --out x --dys 3",
       "unknown option '--dys' for certs (did you mean '--days'?)"},
      {"fusion-data train-bpe a.txt --vocab-sise 300 --out tok",
       "unknown option '--vocab-sise' for train-bpe (did you mean '--vocab-size'?)"},
      {"fusion-probe measure 127.0.0.1:1 --secnds 2", "unknown option '--secnds' for measure (did you mean '--seconds'?)"},
      {"fusion-admin 127.0.0.1:1 --jsno", "unknown option '--jsno' (did you mean '--json'?)"},
      {"fusion-train --config configs/runs/char-tiny.ini --train.stesp=5",
       "unknown option '--train.stesp' (did you mean '--train.steps'?)"},
      {"fusion-node --config configs/nodes/site-a.ini --node.nmae=a1", "unknown option '--node.nmae' (did you mean '--node.name'?)"},
      // Options before the command belong to no command.
      {"fusion-cluster --model x check configs/clusters/sites-3.pbtxt",
       "unknown option '--model' (options follow a command: check, plan, netns or certs)"},
  };
  for (auto& m : mistakes) {
    auto r = run_in_source(prog(m.command));
    INFO(m.command << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, m.says));
  }
}

TEST_CASE("apps/cli: fusion-cluster takes fusion-train's names for the batch, the policy and the codec") {
  const std::string plan = prog("fusion-cluster") + " plan configs/clusters/sites-3.pbtxt --model "
                                                    "configs/models/gpt-char-small.pbtxt --json";
  // --train.batch is the global batch, as in fusion-train: 32 rows in 8 micro-batches of 4.
  auto r = run_in_source(plan + " --train.batch 32 --train.micro-batches 8 --cluster.policy even --compression.mode topk");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "\"micro_batches\": 8"));
  CHECK(contains(r.output, "\"micro_batch_rows\": 4"));
  // check loads the model for the same micro-batches: 4 rows.
  r = run_in_source(prog("fusion-cluster") + " check configs/clusters/sites-3.pbtxt --model "
                                             "configs/models/gpt-char-small.pbtxt --train.batch 32 --train.micro-batches 8");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "is valid"));
  // The old flat spellings say what replaced them.
  const std::vector<mistake> renamed = {
      {"check configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --batch 8",
       "--batch is no longer an option of check: use --train.batch B and --train.micro-batches M"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --micro-batches 4",
       "--micro-batches is no longer an option of plan: use --train.micro-batches M"},
      {"plan configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt --compression topk",
       "--compression is no longer an option of plan: use --compression.mode MODE"},
  };
  for (auto& m : renamed) {
    auto bad = run_in_source(prog("fusion-cluster") + " " + m.command);
    INFO(m.command << "\n" << bad.output);
    CHECK(bad.status == 2);
    CHECK(contains(bad.output, m.says));
  }
}

TEST_CASE("apps/cli: every --help is on stdout with defaults and two examples, every --version has the version") {
  const std::vector<std::string> programs = {"fusion-train", "fusion-node", "fusion-cluster", "fusion-data",
                                             "fusion-probe", "fusion-admin"};
  for (auto& p : programs) {
    auto r = run_in_source(prog(p) + " --help 2>/dev/null");
    INFO(p << "\n" << r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "usage: " + p));
    CHECK(contains(r.output, "default"));
    const auto examples = r.output.find("examples:\n");
    REQUIRE(examples != std::string::npos);
    // Two example lines, each running the program.
    const std::string after = r.output.substr(examples);
    CHECK(after.find("  " + p + " ") != std::string::npos);
    CHECK(after.find("  " + p + " ", after.find("  " + p + " ") + 1) != std::string::npos);
    auto v = run_in_source(prog(p) + " --version");
    INFO(v.output);
    CHECK(v.status == 0);
    CHECK(contains(v.output, p + " " FUSION_VERSION));
  }
  // The defaults of fusion-cluster's options.
  auto r = run_in_source(prog("fusion-cluster") + " help");
  CHECK(contains(r.output, "--train.batch B              global batch: sequences per optimizer step (default: 16)"));
  CHECK(contains(r.output, "--train.micro-batches M      pipeline micro-batches per step, divides B (default: 4)"));
}
