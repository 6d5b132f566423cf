// The command-line mistakes, each with its message in plain words and its exit status
// (docs/training.md, "Exit status"): no parser internals, every setting error at once, the same
// value rules as in INI files, a did-you-mean for options and values.
#include <doctest/doctest.h>

#include "tests/support/fixtures.hpp"

#include <string>
#include <vector>

namespace {

std::string prog(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// No CAF or parser internals reach the user.
void check_plain(const std::string& out) {
  for (const char* word : {"parser_error", "trailing_character", "trailing character", "unexpected character",
                           "not_an_option", "caf::", "Message type", "fusion.pb."})
    CHECK_MESSAGE(!contains(out, word), "'" << word << "' in: " << out);
}

}  // namespace

TEST_CASE("cli errors: fusion-train's value mistakes are said in plain words with status 2") {
  struct mistake {
    std::string args, says;
  };
  const std::string train = prog("fusion-train") + " --config configs/runs/char-tiny.ini --output.metrics= "
                                                  "--output.checkpoint= ";
  const std::vector<mistake> mistakes = {
      {"'--train.steps=5\"'", "bad value in '--train.steps=5\"': train.steps takes a whole number"},
      {"--train.steps=1e3", "bad value in '--train.steps=1e3': train.steps takes a whole number, e.g. 100"},
      {"--train.seed=-1", "bad value in '--train.seed=-1': train.seed takes a whole number of at least 0"},
      {"--optim.lr=abc", "bad value in '--optim.lr=abc': optim.lr takes a number, e.g. 0.001"},
      {"--optim.lr=1", "optim.lr takes a real number with a decimal point, e.g. 1.0 (as in INI files)"},
      {"--cluster.policy=evn", "cluster.policy must be one of opfence, even, explicit, opfence-replicas, got \"evn\" (did you mean 'even'?)"},
      {"--compression.mode=tpok", "compression.mode must be none, topk, adatopk, int8 or int4, got \"tpok\""},
      {"--compression.floor-gradients=int2",
       "compression.floor-gradients must be f16, int8, int4 or a keep ratio above 0 and at most 1, got \"int2\""},
      {"--compression.scale-block=0", "compression.scale-block must be 1 to 65536, got 0"},
      {"--recovery.mode=on", "recovery.mode must be auto or off, got \"on\""},
      {"--recovery.snapshot-every=-1", "recovery.snapshot-every must be 0 (off) or a number of steps, got -1"},
      {"--train.stepz=5", "unknown option '--train.stepz' (did you mean '--train.steps'?)"},
  };
  for (auto& m : mistakes) {
    auto r = fusion::test::run_in_source(train + m.args);
    INFO(m.args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, m.says));
    check_plain(r.output);
  }
}

TEST_CASE("cli errors: every setting error is reported at once") {
  auto r = fusion::test::run_in_source(prog("fusion-train") +
                                       " --config configs/runs/char-tiny.ini --train.batch=0 --optim.beta2=1.0 "
                                       "--cluster.policy=bogus --output.metrics= --output.checkpoint=");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(contains(r.output, "fusion-train: train.batch must be at least 1, got 0\n"));
  CHECK(contains(r.output, "fusion-train: optim.beta2 must be in [0, 1), got 1\n"));
  CHECK(contains(r.output, "fusion-train: cluster.policy must be one of"));
}

TEST_CASE("cli errors: --help goes to stdout with defaults, and fusion-probe takes --security.certs") {
  auto r = fusion::test::run_in_source(prog("fusion-train") + " --help 2>/dev/null");
  CHECK(r.status == 0);
  CHECK(contains(r.output, "total optimizer steps (default: 100)"));
  CHECK(contains(r.output, "newest checkpoints kept in the checkpoint directory (0: all) (default: 3)"));
  r = fusion::test::run_in_source(prog("fusion-probe") + " --help 2>/dev/null");
  CHECK(r.status == 0);
  CHECK(contains(r.output, "usage: fusion-probe serve"));
  CHECK(contains(r.output, "examples:"));
  // The command: --security.certs is an option, not a number to parse.
  r = fusion::test::run_in_source(prog("fusion-probe") + " measure 127.0.0.1:1 --security.certs /nonexistent");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(contains(r.output, "TLS needs --security.certs, --node.name and --peer together"));
  CHECK_FALSE(contains(r.output, "non-negative number"));
  r = fusion::test::run_in_source(prog("fusion-admin") + " --version");
  CHECK(r.status == 0);
  CHECK(contains(r.output, "fusion-admin " FUSION_VERSION " (wire protocol"));
}
