// Fuzzes the INI checker (core/ini_check.hpp check_ini): CAF 0.17's INI grammar (categories,
// quoted strings with escapes, atoms, numbers in every base, timespans, URIs, lists spanning
// lines, maps) and the comparison against a schema with every option kind.
//
// check_ini reports problems as values and never throws; any exception is reported as a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/ini_check.hpp"

namespace {

using k = fusion::ini_option::kind;

// Options of the real programs (configs/runs/*.ini, configs/nodes/*.ini), so their files are
// valid seeds, plus those of tests/core/ini_check_test.cpp: every kind, with and without a max.
const std::vector<fusion::ini_option> schema = {
    {"model", "file", k::string},           {"data", "file", k::string},
    {"data", "val-fraction", k::real},      {"train", "batch", k::unsigned_integer},
    {"train", "steps", k::unsigned_integer}, {"train", "seed", k::integer},
    {"train", "micro-batches", k::unsigned_integer, 4096},
    {"train", "verbose", k::boolean},       {"train", "step-timeout", k::timespan},
    {"train", "peers", k::string_list},     {"train", "layers", k::integer_list},
    {"optim", "lr", k::real},               {"optim", "kind", k::string},
    {"output", "metrics", k::string},       {"runtime", "quiet", k::boolean},
    {"runtime", "threads", k::unsigned_integer}, {"node", "coordinator", k::string},
    {"node", "join-timeout", k::real},      {"cluster", "heartbeat-ms", k::unsigned_integer, 65535},
    {"global", "host", k::string},          {"global", "port", k::unsigned_integer, 65535},
    {"middleman", "heartbeat-interval", k::timespan},
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& p : fusion::check_ini(text, "fuzz.ini", schema)) (void)fusion::to_string(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "check_ini threw %s\n", e.what());
    std::abort();
  }
  return 0;
}
