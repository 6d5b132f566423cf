// The fusion-* programs as a new user meets them: --version, `--key value`, bool options, usage
// mistakes (exit 2), paths in a config file relative to the file, the vocabulary following the
// corpus, messages in the words of the options, out of memory, and SIGINT to fusion-node and
// (twice) to fusion-train.
#include <doctest/doctest.h>

#include "tests/support/certs_fixture.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/fixtures.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/data.hpp"
#include "core/wire.hpp"

namespace {

namespace fs = std::filesystem;
using fusion::test::child_process;
using fusion::test::run_result;
using fusion::test::read_file;
using fusion::test::src;
using fusion::test::write_file;
// A per-test directory of this file's group.
struct scratch_dir : fusion::test::scratch_dir {
  explicit scratch_dir(const std::string& name) : fusion::test::scratch_dir("options", name) {}
};

std::string bin(const std::string& name) { return std::string(FUSION_BINARY_DIR) + "/apps/" + name; }

// The program for a shell command line, stopped (TERM, then KILL) should it ever hang.
std::string cmd(const std::string& name) { return "timeout -k 5 180 " + bin(name); }

run_result run_in(const fs::path& cwd, const std::string& command) {
  return fusion::test::run_in(cwd.string(), command);
}

run_result run_in_source(const std::string& command) { return run_in(FUSION_SOURCE_DIR, command); }




size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Words of lower-case letters, plus `extra` characters now and then: a corpus of ~30 000 bytes
// for gpt-char-tiny (context 64, vocabulary 64).
std::string corpus_text(const std::string& extra = "") {
  std::string out;
  uint64_t h = 12345;
  for (int i = 0; out.size() < 30000; ++i) {
    h = fusion::splitmix64(h);
    int len = 2 + static_cast<int>(h % 7);
    for (int k = 0; k < len; ++k) out += static_cast<char>('a' + (h >> (8 + 5 * k)) % 26);
    if (!extra.empty() && i % 17 == 0) out += extra[static_cast<size_t>(i / 17) % extra.size()];
    out += i % 12 == 11 ? '\n' : ' ';
  }
  return out;
}

// A short one-process run: 2 steps of batch 8, nothing written, no sample.
const std::string quick = " --train.steps 2 --train.batch 8 --train.micro-batches 2 --train.eval-batches 0"
                          " --output.sample-chars 0 --output.metrics= --output.checkpoint=";

// The strings no message may show: C++ and CAF internals.
void check_no_internals(const std::string& output) {
  for (const char* internal : {"text_dataset", "char_tokenizer", "std::", "stoi", "stod", "bad_alloc",
                               "basic_string", "caf::", "total_steps", "val_fraction", "_error"})
    CHECK_MESSAGE(!contains(output, internal), "'" << internal << "' in: " << output);
}

// Waits up to `seconds` for `part` to appear in the child's output.
bool wait_for_output(const child_process& c, const std::string& part, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (contains(c.output(), part)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A node log line: "2026-11-23 12:00:01.234 INFO  fusion-node NAME: text".
bool has_log_line(const std::string& output, const std::string& level, const std::string& who,
                  const std::string& text) {
  std::regex re("(^|\n)\\d{4}-\\d{2}-\\d{2} \\d{2}:\\d{2}:\\d{2}\\.\\d{3} " + level + " +" + who + ": [^\n]*" +
                std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"));
  return std::regex_search(output, re);
}

}  // namespace

TEST_CASE("apps/options: every program prints its version and wire protocol for --version") {
  const std::string expected_tail =
      std::string(" ") + FUSION_VERSION + " (wire protocol " + std::to_string(fusion::wire_protocol_version) + ")\n";
  CHECK(std::regex_match(std::string(FUSION_VERSION), std::regex(R"(\d+\.\d+\.\d+)")));
  for (const char* program : {"fusion-train", "fusion-node", "fusion-cluster", "fusion-probe"}) {
    CAPTURE(program);
    auto r = run_in_source(cmd(program) + " --version");
    CHECK(r.status == 0);
    CHECK(r.output == program + expected_tail);
  }
  // --help points to the one list of exit codes, and that list exists.
  auto help = run_in_source(cmd("fusion-train") + " --help");
  CHECK(help.status == 0);
  CHECK(contains(help.output, "the full list: docs/training.md, section \"Exit status\""));
  CHECK(contains(read_file(src("docs/training.md")), "\n## Exit status\n"));
  // After other options too, without reading any config.
  auto r = run_in_source(cmd("fusion-train") + " --config /nonexistent.ini --version");
  CHECK(r.status == 0);
  CHECK(r.output == "fusion-train" + expected_tail);
}

// The docs stay true to the option table: every option fusion-train accepts has a row, in
// docs/training.md ("| category | key[, key...] | ...") or, for the categories with a page of
// their own, in that page's settings table ("| `key` | ...").
TEST_CASE("apps/options: every option of fusion-train --help has a row in the docs") {
  auto help = run_in_source(cmd("fusion-train") + " --help");
  REQUIRE(help.status == 0);
  const std::map<std::string, std::string> own_page = {
      {"compression", "docs/compression.md"}, {"scheduler", "docs/migration.md"}, {"security", "docs/security.md"}};
  auto rows_of = [](const std::string& doc) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(read_file(src(doc)));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("| ", 0) != 0) continue;
      std::vector<std::string> cells;
      std::istringstream cut(line.substr(1));
      for (std::string cell; std::getline(cut, cell, '|');) {
        cell.erase(0, cell.find_first_not_of(' '));
        cell.erase(cell.find_last_not_of(' ') + 1);
        cells.push_back(cell);
      }
      rows.push_back(cells);
    }
    return rows;
  };
  auto keys_of = [](std::string cell) {  // "`a`, `b`" or "a, b"
    cell.erase(std::remove(cell.begin(), cell.end(), '`'), cell.end());
    std::vector<std::string> keys;
    std::istringstream cut(cell);
    for (std::string k; std::getline(cut, k, ',');) keys.push_back(k.substr(k.find_first_not_of(' ')));
    return keys;
  };
  const auto training = rows_of("docs/training.md");
  const std::regex option(R"(\n  --([a-z0-9-]+)\.([a-z0-9-]+)=)");
  int seen = 0;
  for (std::sregex_iterator it(help.output.begin(), help.output.end(), option), end; it != end; ++it, ++seen) {
    const std::string category = (*it)[1], key = (*it)[2];
    CAPTURE(category + "." + key);
    bool documented = false;
    if (auto page = own_page.find(category); page != own_page.end()) {
      for (auto& row : rows_of(page->second))
        if (!row.empty() && row[0].rfind("`", 0) == 0 && std::ranges::count(keys_of(row[0]), key) > 0) documented = true;
    } else {
      for (auto& row : training)
        if (row.size() > 2 && row[0] == category && std::ranges::count(keys_of(row[1]), key) > 0) documented = true;
    }
    CHECK(documented);
  }
  CHECK(seen > 80);  // the table was read at all
}

TEST_CASE("apps/options: --key value works like --key=value (fusion-node, with timestamped log lines)") {
  // Nothing listens on port 1: the node gives up after node.join-timeout.
  auto spaced = run_in_source(cmd("fusion-node") +
                              " --config configs/nodes/site-a.ini --node.name n9 --node.coordinator 127.0.0.1:1"
                              " --node.join-timeout 0.5 --security.certs " + fusion::test::certs_dir());
  INFO(spaced.output);
  CHECK(spaced.status == 1);
  CHECK(has_log_line(spaced.output, "ERROR", "fusion-node n9",
                     "cannot reach the coordinator at 127.0.0.1:1 within 0.5 s (node.join-timeout)"));
  CHECK(has_log_line(spaced.output, "INFO ", "fusion-node n9", "waiting for the coordinator at 127.0.0.1:1"));
  CHECK_FALSE(contains(spaced.output, "0.500000"));
  auto equals = run_in_source(cmd("fusion-node") +
                              " --config=configs/nodes/site-a.ini --node.name=n9 --node.coordinator=127.0.0.1:1"
                              " --node.join-timeout=0.5 --security.certs=" + fusion::test::certs_dir());
  CHECK(equals.status == 1);
  CHECK(contains(equals.output, "within 0.5 s (node.join-timeout)"));
}

TEST_CASE("apps/options: --runtime.quiet alone, =true, =false, `true`/`false` and over a config file") {
  scratch_dir dir("quiet");
  const std::string model = src("configs/models/gpt-char-tiny.pbtxt");
  write_file(dir / "corpus.txt", corpus_text());
  write_file(dir / "run.ini", "[model]\nfile=\"" + model + "\"\n[data]\nfile=\"corpus.txt\"\n[train]\nlog-every=1\n");
  write_file(dir / "quiet.ini", "[model]\nfile=\"" + model + "\"\n[data]\nfile=\"corpus.txt\"\n[train]\nlog-every=1\n"
                                "[runtime]\nquiet=true\n");
  auto progress_lines = [&](const std::string& config, const std::string& args) {
    auto r = run_in(dir.path, cmd("fusion-train") + " --config " + config + quick + " " + args);
    INFO(args << "\n" << r.output);
    CHECK(r.status == 0);
    return count(r.output, "step 1/2");
  };
  CHECK(progress_lines("run.ini", "") == 1);
  CHECK(progress_lines("run.ini", "--runtime.quiet") == 0);
  CHECK(progress_lines("run.ini", "--runtime.quiet=true") == 0);
  CHECK(progress_lines("run.ini", "--runtime.quiet true") == 0);
  CHECK(progress_lines("run.ini", "--runtime.quiet=false") == 1);
  CHECK(progress_lines("run.ini", "--runtime.quiet false") == 1);
  CHECK(progress_lines("quiet.ini", "") == 0);
  CHECK(progress_lines("quiet.ini", "--runtime.quiet=false") == 1);  // the command line wins
  CHECK(progress_lines("quiet.ini", "--runtime.quiet false") == 1);
  // --key value for integers, reals, strings and an alias, in one run.
  auto r = run_in(dir.path, cmd("fusion-train") + " --config run.ini --steps 2 --optim.lr 2.0e-3 --model " + model +
                                " --train.batch 8 --train.micro-batches 2 --train.eval-batches 0"
                                " --output.sample-chars 0 --output.metrics= --output.checkpoint=");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "step 2/2"));
  CHECK(contains(r.output, "batch 8 in 2 micro-batches"));
}

TEST_CASE("apps/options: usage and configuration mistakes exit 2 and say what is wrong") {
  scratch_dir dir("usage");
  write_file(dir / "run.ini", "[model]\nfile=\"" + src("configs/models/gpt-char-tiny.pbtxt") + "\"\n");
  write_file(dir / "port.ini", "[admin]\nport=70000\n");
  const std::string train = cmd("fusion-train") + " --config run.ini";
  struct mistake {
    std::string args;
    std::string says;
  };
  const mistake mistakes[] = {
      {"--runtime.quiet=maybe", "--runtime.quiet is true or false"},
      {"--train.steps", "--train.steps needs a value"},
      {"--train.steps 2 two", "unexpected argument 'two'"},
      {"--admin.port 70000", "--admin.port=70000: must be at most 65535"},
      {"--train.batch 0", "train.batch must be at least 1, got 0"},
      {"--train.batch 8 --train.micro-batches 3", "train.micro-batches (3) must be at least 1 and divide"},
      {"--optim.beta2 1.0", "optim.beta2 must be in [0, 1), got 1"},
      {"--optim.total-steps -1", "optim.total-steps must be >= 0, got -1"},
      {"--data.val-fraction 1.0", "data.val-fraction must be at least 0 and below 1, got 1"},
      {"--runtime.step-timeout 0.0", "runtime.step-timeout must be more than 0 and at most 1000000 seconds, got 0"},
      {"--model=", "no model file"},
      {"--sample 5 --output.checkpoint=", "--sample needs a checkpoint"},
  };
  for (auto& m : mistakes) {
    auto r = run_in(dir.path, train + " " + m.args);
    INFO(m.args << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, m.says));
    check_no_internals(r.output);
  }
  auto r = run_in(dir.path, cmd("fusion-train") + " --config port.ini");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "port.ini:2"));
  r = run_in(dir.path, cmd("fusion-train") + " --config missing.ini");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "cannot open config file 'missing.ini'"));
  r = run_in(dir.path, cmd("fusion-node") + " --config " + src("configs/nodes/site-a.ini") + " --node.join-timeout");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "--node.join-timeout needs a value"));
}

TEST_CASE("apps/options: fusion-probe, fusion-cluster and fusion-admin name the option of a usage mistake") {
  struct mistake {
    std::string command, says;
  };
  const mistake mistakes[] = {
      {"fusion-probe", ""},
      {"fusion-probe frobnicate", "unknown command 'frobnicate'"},
      {"fusion-probe serve --bogus 1", "unknown option '--bogus' for serve"},
      {"fusion-probe serve --peer n0", "unknown option '--peer' for serve"},
      {"fusion-probe serve --host", "--host needs a value"},
      {"fusion-probe serve --port 70000", "--port must be at most 65535, got 70000"},
      {"fusion-probe serve --port=-1", "--port expects a non-negative number, got '-1'"},
      {"fusion-probe measure", "measure needs HOST:PORT"},
      {"fusion-probe serve --port 2.5", "--port expects a whole number, got 2.5"},
      {"fusion-probe measure nohost", "expected HOST:PORT, got 'nohost'"},
      {"fusion-probe measure ::1:7799", "an IPv6 address takes brackets before its port, e.g. [::1]:7700"},
      {"fusion-probe measure 127.0.0.1:1 --seconds x", "--seconds expects a non-negative number, got 'x'"},
      {"fusion-probe measure 127.0.0.1:1 --seconds 1e400", "--seconds must be at most 86400, got 1e400"},
      {"fusion-probe measure 127.0.0.1:1 --warmup 1e12", "--warmup must be at most 86400, got 1e12"},
      {"fusion-probe measure 127.0.0.1:1 --frame-kib 1e30", "--frame-kib must be at most 1048576, got 1e30"},
      {"fusion-probe measure 127.0.0.1:1 --certs /nonexistent", "TLS needs --security.certs, --node.name and --peer together"},
      {"fusion-probe measure 127.0.0.1:1 --security.certs /nonexistent --node.name a1", "TLS needs --security.certs, --node.name and --peer together"},
      {"fusion-probe serve --prot 1", "unknown option '--prot' for serve (did you mean '--port'?)"},
      {"fusion-cluster", "missing command (check, plan, netns or certs)"},
      {"fusion-cluster nope", "unknown command 'nope'"},
      {"fusion-cluster netns configs/clusters/sites-3.pbtxt --model x", "unknown option '--model' for netns"},
      {"fusion-cluster check configs/clusters/sites-3.pbtxt more", "unexpected argument 'more'"},
      {"fusion-cluster check configs/clusters/sites-3.pbtxt --train.batch 4", "--train.batch needs --model"},
      {"fusion-cluster certs configs/clusters/sites-3.pbtxt --out", "--out needs a value"},
      {"fusion-cluster certs configs/clusters/sites-3.pbtxt --out /tmp/x --days 36501", "--days must be at most 36500, got 36501"},
      {"fusion-cluster plan configs/clusters/sites-3.pbtxt --train.batch 99999999999999999999",
       "--train.batch must be at most 9223372036854775807, got 99999999999999999999"},
      {"fusion-cluster plan configs/clusters/sites-3.pbtxt --json=yes", "--json takes no value"},
      {"fusion-cluster plan configs/clusters/sites-3.pbtxt --compression.mode zip", "--compression.mode must be none, topk"},
      {"fusion-admin 127.0.0.1:1 -c", "-c needs the commands to run"},
      {"fusion-admin -c status 127.0.0.1:1 127.0.0.1:2", "one coordinator address expected, got '127.0.0.1:1' and"},
      {"fusion-admin 127.0.0.1:0", "port 0 is not a port"},
  };
  for (auto& m : mistakes) {
    auto r = run_in_source(cmd(m.command));
    INFO(m.command << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, m.says));
    check_no_internals(r.output);
  }
  // --help prints the usage and exits 0, also after a command.
  for (const char* help : {"fusion-probe --help", "fusion-cluster plan --help", "fusion-cluster help", "fusion-admin -h"}) {
    auto r = run_in_source(cmd(help));
    INFO(help << "\n" << r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "usage: "));
  }
}

TEST_CASE("apps/fusion-train: paths in a config are relative to its directory, on the command line to the cwd") {
  scratch_dir dir("paths");
  fs::create_directories(dir / "models");
  fs::copy_file(src("configs/models/gpt-char-tiny.pbtxt"), dir / "models/tiny.pbtxt");
  write_file(dir / "data/corpus.txt", corpus_text());
  write_file(dir / "cfg/run.ini", "[model]\nfile=\"../models/tiny.pbtxt\"\n[data]\nfile=\"../data/corpus.txt\"\n"
                                  "[train]\nbatch=8\nmicro-batches=2\nsteps=2\neval-batches=0\n"
                                  "[output]\nmetrics=\"../out/m.jsonl\"\ncheckpoint=\"../out/c.ckpt\"\n"
                                  "sample-chars=0\n");
  fs::create_directories(dir / "elsewhere");
  // The config named relative to the cwd, its own paths relative to cfg/.
  auto r = run_in(dir / "elsewhere", cmd("fusion-train") + " --config ../cfg/run.ini");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(fs::exists(dir / "out/m.jsonl"));
  CHECK(fs::exists(dir / "out/c.ckpt"));
  CHECK(fs::exists(dir / "data/corpus.vocab"));  // the vocabulary sits next to the corpus
  CHECK_FALSE(fs::exists(dir / "elsewhere/out"));
  CHECK_FALSE(fs::exists(dir / "cfg/out"));
  // Paths on the command line are relative to the cwd: metrics here, resume from there.
  r = run_in(dir / "elsewhere", cmd("fusion-train") + " --config ../cfg/run.ini --output.metrics rel.jsonl "
                                    "--resume ../out/c.ckpt --train.steps 3 --output.checkpoint=");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "resumed at step 2"));
  CHECK(fs::exists(dir / "elsewhere/rel.jsonl"));
  CHECK_FALSE(fs::exists(dir / "cfg/rel.jsonl"));
  // The same config from its own directory and by an absolute path (--force: over the first
  // run's metrics, which are found there, so the path resolved to the same file).
  r = run_in(dir / "cfg", cmd("fusion-train") + " --config run.ini --output.checkpoint=");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "an earlier run left the metrics file ../out/m.jsonl"));
  r = run_in(dir / "cfg", cmd("fusion-train") + " --config run.ini --output.checkpoint= --force");
  CHECK(r.status == 0);
  r = run_in("/", cmd("fusion-train") + " --config " + (dir / "cfg/run.ini").string() + " --output.checkpoint= --force");
  CHECK(r.status == 0);
  // The shipped configs work from any directory (they reach data/kjv.txt as ../../data/kjv.txt).
  if (fs::exists(src("data/kjv.txt"))) {
    r = run_in(dir / "elsewhere", cmd("fusion-train") + " --config " + src("configs/runs/char-tiny.ini") + quick);
    INFO(r.output);
    CHECK(r.status == 0);
  }
}

TEST_CASE("apps/fusion-train: the vocabulary follows the corpus") {
  scratch_dir dir("vocab");
  // Characters the King James Bible does not have.
  write_file(dir / "data/mine.txt", corpus_text("~#{}"));
  const std::string mine = (dir / "data/mine.txt").string();
  // Own text with a shipped config: no vocabulary to clear, the corpus gets its own next to it.
  if (fs::exists(src("data/kjv.txt"))) {
    const fs::path kjv_vocab = src("data/kjv.vocab");
    std::string before = fs::exists(kjv_vocab) ? read_file(kjv_vocab) : "";
    auto r = run_in_source(cmd("fusion-train") + " --config configs/runs/char-tiny.ini --data.file " + mine + quick);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(fs::exists(dir / "data/mine.vocab"));
    if (!before.empty()) CHECK(read_file(kjv_vocab) == before);  // the shipped corpus's vocabulary is untouched
  }
  // A config naming a vocabulary file built from another corpus: rebuilt, with a note.
  fusion::char_tokenizer other;
  other.build("abc def\n");
  fs::create_directories(dir / "cfg");
  other.save((dir / "cfg/other.vocab").string());
  write_file(dir / "cfg/run.ini", "[model]\nfile=\"" + src("configs/models/gpt-char-tiny.pbtxt") +
                                      "\"\n[data]\nfile=\"../data/mine.txt\"\nvocab=\"other.vocab\"\n");
  auto r = run_in(dir.path, cmd("fusion-train") + " --config cfg/run.ini" + quick);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "fusion-train: note: vocabulary cfg/other.vocab lacks"));
  CHECK(contains(r.output, "rebuilt from this one"));
  fusion::char_tokenizer now;
  now.load((dir / "cfg/other.vocab").string());
  CHECK_NOTHROW(now.encode(read_file(dir / "data/mine.txt")));
  // The next run reads it without a note.
  r = run_in(dir.path, cmd("fusion-train") + " --config cfg/run.ini" + quick);
  CHECK(r.status == 0);
  CHECK_FALSE(contains(r.output, "note:"));
  // An empty corpus is said as such, and leaves no vocabulary of no characters behind.
  write_file(dir / "data/empty.txt", "");
  r = run_in(dir.path, cmd("fusion-train") + " --model " + src("configs/models/gpt-char-tiny.pbtxt") +
                           " --data.file data/empty.txt" + quick);
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(contains(r.output, "corpus file data/empty.txt is empty: name a text file with data.file"));
  CHECK_FALSE(fs::exists(dir / "data/empty.vocab"));
}

TEST_CASE("apps/fusion-train: running out of memory is said in plain words") {
  // (Messages of bad settings are checked with the usage mistakes above; the data messages,
  // e.g. a validation split too short for one batch, in tests/core/data_test.cpp.)
  scratch_dir dir("memory");
  const std::string model = src("configs/models/gpt-char-tiny.pbtxt");
  run_result r;
  // Out of memory while reading a (sparse, 4 GiB) corpus under a 3 GB address-space limit (a
  // CUDA build maps several hundred MB of cuBLAS at start: a smaller limit fails to load it).
  {
    std::ofstream(dir / "huge.txt").close();
    fs::resize_file(dir / "huge.txt", uint64_t{4} << 30);
    r = run_in(dir.path, "ulimit -v 3000000 && " + cmd("fusion-train") + " --model " + model +
                             " --data.file huge.txt" + quick);
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "fusion-train: out of memory while reading the corpus huge.txt"));
    check_no_internals(r.output);
  }
}

TEST_CASE("apps/fusion-node: SIGINT while it waits for the coordinator exits 130 with a log line") {
  auto log = fusion::test::temp_path("options", "node-sigint.log");
  child_process node({bin("fusion-node"), "--config", src("configs/nodes/site-a.ini"), "--node.name=sig1",
                      "--node.coordinator=127.0.0.1:1", "--node.join-timeout=120.0", fusion::test::certs_arg()},
                     log);
  REQUIRE(wait_for_output(node, "waiting for the coordinator", 60));
  auto t0 = std::chrono::steady_clock::now();
  node.signal(SIGINT);
  int status = node.wait(3.0);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(node.output());
  CHECK(status == 130);
  CHECK(took < 3.0);
  CHECK(has_log_line(node.output(), "INFO ", "fusion-node sig1", "SIGINT received: stopping"));
  CHECK(has_log_line(node.output(), "INFO ", "fusion-node sig1", "stopped by SIGINT, exiting with status 130"));
  std::remove(log.c_str());
}

TEST_CASE("apps/fusion-node: SIGINT during a run stops its actors and exits 130 at once") {
  auto log = [](const std::string& name) { return fusion::test::temp_path("options", "run-" + name + ".log"); };
  child_process coordinator({bin("fusion-train"), "--config", src("configs/runs/char-tiny.ini"), "--cluster",
                             src("configs/clusters/local-2.pbtxt"), "--cluster.listen=127.0.0.1:0", "--steps",
                             "100000", "--train.log-every=1", "--output.metrics=", "--output.checkpoint=",
                             fusion::test::certs_arg()},
                            log("coordinator"), FUSION_SOURCE_DIR);
  REQUIRE(wait_for_output(coordinator, "on 127.0.0.1:", 60));
  auto out = coordinator.output();
  const std::string port = std::to_string(std::stoi(out.substr(out.find("on 127.0.0.1:") + 13)));
  auto node = [&](const std::string& name) {
    return child_process({bin("fusion-node"), "--config", src("configs/nodes/site-a.ini"), "--node.name=" + name,
                          "--node.coordinator=127.0.0.1:" + port, fusion::test::certs_arg()},
                         log(name));
  };
  child_process a1 = node("a1"), b1 = node("b1");
  REQUIRE(wait_for_output(coordinator, "step 3/", 60));
  a1.signal(SIGINT);
  int status = a1.wait(3.0);
  INFO(a1.output());
  CHECK(status == 130);
  CHECK(has_log_line(a1.output(), "INFO ", "fusion-node a1", "stopped by SIGINT, exiting with status 130"));
  CHECK_FALSE(contains(a1.output(), "still not stopped"));  // a clean stop, not the deadline
  for (auto* name : {"coordinator", "a1", "b1"}) std::remove(log(name).c_str());
}

TEST_CASE("apps/fusion-train: a second SIGINT exits at once with status 130") {
  // A cluster run whose nodes never come: it waits for them.
  auto log = fusion::test::temp_path("options", "train-sigint.log");
  child_process train({bin("fusion-train"), "--config", src("configs/runs/char-tiny.ini"), "--cluster",
                       src("configs/clusters/local-3.pbtxt"), "--cluster.listen=127.0.0.1:0",
                       "--cluster.join-timeout=300.0", "--output.metrics=", "--output.checkpoint=",
                       fusion::test::certs_arg()},
                      log, FUSION_SOURCE_DIR);
  REQUIRE(wait_for_output(train, "on 127.0.0.1:", 60));
  auto t0 = std::chrono::steady_clock::now();
  train.signal(SIGINT);
  // The first one asks for a clean stop (once the coordinator honours it while nodes join, it
  // alone ends the run with 130); the second one ends it at once.
  CHECK(wait_for_output(train, "fusion-train: stopping", 2));
  if (train.wait(0.3) == -2) train.signal(SIGINT);
  int status = train.wait(3.0);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(train.output());
  CHECK(status == 130);
  CHECK(took < 3.5);
  CHECK(contains(train.output(), "fusion-train: interrupted"));
  std::remove(log.c_str());
}
