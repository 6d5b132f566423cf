// INI linter tests: one per problem kind, each checking file, line and message, and a valid file
// using every value syntax that yields no problems.
#include <doctest/doctest.h>

#include "core/ini_check.hpp"

namespace fusion {
namespace {

using k = ini_option::kind;

const std::vector<ini_option> schema = {
    {"global", "host", k::string},          {"global", "port", k::unsigned_integer, 65535},
    {"train", "lr", k::real},               {"train", "batch", k::unsigned_integer},
    {"train", "seed", k::integer},          {"train", "verbose", k::boolean},
    {"train", "step-timeout", k::timespan}, {"train", "peers", k::string_list},
    {"train", "layers", k::integer_list},   {"middleman", "heartbeat-interval", k::timespan},
};

std::vector<ini_problem> check(const std::string& text) { return check_ini(text, "runs/x.ini", schema); }

// Exactly one problem, on `line`, whose message contains every part.
void check_one(const std::string& text, int line, std::initializer_list<const char*> parts) {
  auto ps = check(text);
  std::string all;
  for (auto& p : ps) all += to_string(p) + "\n";
  INFO(all);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].file == "runs/x.ini");
  CHECK(ps[0].line == line);
  for (const char* part : parts) CHECK(ps[0].message.find(part) != std::string::npos);
}

TEST_CASE("core/ini_check: a valid file has no problems") {
  auto ps = check(
      "; node config\n"
      "[global]\n"
      "host=\"10.0.0.1\"   ; trailing comment\n"
      "port = 0x1f90\n"
      "\n"
      "[train]\n"
      "lr=3.0e-3\n"
      "batch=16\n"
      "seed=-7\n"
      "verbose=true\n"
      "step-timeout=250ms\n"
      "peers=[\"a:1\", \"b\\\\\\\"q\\\"\", ; comment inside\n"
      "  \"c\"]\n"
      "layers=[1, 2,\n 3]\n"
      "[ middleman ]\n"
      "heartbeat-interval=1min\n");
  std::string all;
  for (auto& p : ps) all += to_string(p) + "\n";
  INFO(all);
  CHECK(ps.empty());
}

TEST_CASE("core/ini_check: wrong value types name the expected kind") {
  check_one("[train]\nlr=1\n", 2, {"[train] lr: expected a real number with a decimal point (e.g. 1.0), got 1"});
  check_one("[train]\nbatch=-1\n", 2, {"[train] batch: expected an unsigned integer", "got -1"});
  check_one("[train]\nbatch=\"abc\"\n", 2, {"[train] batch: expected an unsigned integer", "got \"abc\""});
  check_one("[train]\nstep-timeout=2\n", 2, {"step-timeout: expected a timespan with a unit", "got 2"});
  check_one("[train]\npeers=\"a\"\n", 2, {"peers: expected a list of quoted strings", "got \"a\""});
  check_one("[train]\nlayers=[1, 2.5]\n", 2, {"layers: element 2 of the list: expected an integer", "2.5"});
  check_one("[train]\nverbose=1\n", 2, {"verbose: expected true or false, got 1"});
  check_one("[train]\nseed=1.0\n", 2, {"seed: expected an integer"});
  check_one("[global]\nhost='atom'\n", 2, {"host: expected a quoted string", "got 'atom'"});
  check_one("[global]\nport=70000\n", 2, {"port: expected an integer <= 65535, got 70000"});
}

TEST_CASE("core/ini_check: malformed lines") {
  check_one("[train]\nlr=fast\n", 2, {"malformed line", "unquoted string 'fast'"});
  check_one("[train]\nlr 1.0\n", 2, {"malformed line", "expected '='"});
  check_one("[train]\n# comment\n", 2, {"malformed line", "';' comment"});
  check_one("[train]\nlr=1.0\n[optim\n", 3, {"malformed line", "category header"});
  check_one("[global]\nhost=\"abc\n", 2, {"malformed line", "unterminated string"});
  check_one("[global]\nhost=\"a\\qb\"\n", 2, {"illegal escape"});
  check_one("[train]\nstep-timeout=1.5s\n", 2, {"whole number"});
  check_one("[train]\nstep-timeout=3sec\n", 2, {"unknown unit 'sec'"});
  check_one("[train]\nbatch=08\n", 2, {"octal"});
  check_one("[train]\nlr=1.0 2.0\n", 2, {"unexpected '2.0'"});
  check_one("[train]\nlr=\n", 2, {"missing value"});
  check_one("[train]\nlayers=[1, 2\nlr=1.0\n", 2, {"malformed line"});
}

// Found by tests/fuzz/fuzz_ini.cpp (seed tests/fuzz/corpus/ini/deep-nesting): lists and maps
// were read by unbounded recursion, so a line of 100000 '[' overflowed the stack.
TEST_CASE("core/ini_check: lists and maps nested too deep are a malformed line, not a crash") {
  const std::string deep_list(100000, '[');
  check_one("[train]\npeers=" + deep_list + "\nlr=1.0\n", 2, {"malformed line", "nested deeper than 64 levels"});
  std::string deep_map;
  for (int i = 0; i < 100000; ++i) deep_map += "{a=";
  check_one("[train]\nlayers=" + deep_map + "\n", 2, {"nested deeper than 64 levels"});
  // At the limit it is only the wrong type for a list of strings.
  auto ps = check("[train]\npeers=" + std::string(64, '[') + std::string(64, ']') + "\n");
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].message.find("nested deeper") == std::string::npos);
}

TEST_CASE("core/ini_check: unknown categories and keys suggest the closest name") {
  check_one("[trian]\nlr=1\n", 1, {"unknown category [trian]", "did you mean [train]", "known: global, train"});
  check_one("[train]\nlrr=1.0\n", 2, {"[train] unknown key 'lrr'", "did you mean 'lr'"});
  check_one("[train]\nstep-timout=1s\n", 2, {"unknown key 'step-timout'", "did you mean 'step-timeout'"});
  check_one("[scheduler]\nmax-threads=2\n", 1, {"unknown category [scheduler]"});  // CAF's own, not accepted here
}

TEST_CASE("core/ini_check: key outside any category") {
  check_one("lr=1.0\n[train]\n", 1, {"key 'lr' is outside any [category]"});
}

TEST_CASE("core/ini_check: duplicate key") {
  check_one("[train]\nlr=1.0\nbatch=2\n[train]\nlr=2.0\n", 5, {"[train] lr: duplicate key (first set at line 2)"});
}

TEST_CASE("core/ini_check: several problems come back in file order") {
  auto ps = check("[train]\nlr=1\nbatch=-2\n[nope]\nx=1\n");
  REQUIRE(ps.size() == 3);
  CHECK(ps[0].line == 2);
  CHECK(ps[1].line == 3);
  CHECK(ps[2].line == 4);
  CHECK(to_string(ps[0]).rfind("runs/x.ini:2: [train] lr:", 0) == 0);
}

}  // namespace
}  // namespace fusion
