// Fuzzes the checkpoint reader (core/checkpoint.hpp load_checkpoint): header, size fields,
// names, dtypes, ranks, dims and data lengths checked against the file size before anything is
// allocated, and the XXH64 trailer.
//
// The reader only takes a path, so the bytes go through one temporary file per process. The
// header's file-size field (offset 16) is patched to the input's length first: the reader
// refuses any other value at once, and without the patch nearly every mutation that changes the
// length would stop there. The checksum is checked last, so it needs no patch.
// load_checkpoint's contract is std::runtime_error "checkpoint PATH: ..."; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"

namespace {

const std::string& temp_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/fuzz_checkpoint." + std::to_string(::getpid()) + ".ckpt";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (bytes.size() >= 24)
    for (int i = 0; i < 8; ++i) bytes[16 + i] = static_cast<uint8_t>(uint64_t{bytes.size()} >> (8 * i));
  const std::string& path = temp_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  try {
    auto ckpt = fusion::load_checkpoint(path);
    (void)fusion::first_non_finite(ckpt);
  } catch (const std::runtime_error&) {
    // A refused file: the expected outcome for almost every input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "load_checkpoint threw %s instead of std::runtime_error\n", e.what());
    std::abort();
  }
  std::remove(path.c_str());
  return 0;
}
