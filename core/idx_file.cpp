#include "core/idx_file.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace fusion {

namespace {

constexpr uint8_t idx_type_u8 = 0x08;

int rank_of(idx_kind kind) { return kind == idx_kind::images ? 3 : 1; }
const char* kind_name(idx_kind kind) { return kind == idx_kind::images ? "image" : "label"; }
uint32_t magic_of(idx_kind kind) { return (uint32_t{idx_type_u8} << 8) | static_cast<uint32_t>(rank_of(kind)); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// A gzFile that closes itself.
struct gz_closer {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};
using gz_ptr = std::unique_ptr<gzFile_s, gz_closer>;

// Reads up to `want` bytes; fewer only at the end of the data. A damaged gzip stream (bad CRC,
// corrupt deflate data) throws, so "short" always means the data ended.
int64_t read_some(gzFile f, const std::string& path, uint8_t* dst, int64_t want) {
  int64_t got = 0;
  while (got < want) {
    // gzread takes an unsigned count and returns an int: go in pieces of at most 1 GiB.
    auto piece = static_cast<unsigned>(std::min<int64_t>(want - got, int64_t{1} << 30));
    int n = gzread(f, dst + got, piece);
    if (n < 0) {
      int errnum = Z_OK;
      const char* msg = gzerror(f, &errnum);
      std::string why = errnum == Z_ERRNO ? std::strerror(errno) : "damaged gzip data (" + std::string(msg) + ")";
      throw std::runtime_error(path + " cannot be read: " + why);
    }
    if (n == 0) break;
    got += n;
  }
  // zlib reports a gzip stream cut off mid-member as Z_BUF_ERROR ("unexpected end of file")
  // after handing out what it had: the caller's byte count says whether data is missing (a
  // stream that lacks only its trailer still delivered every byte).
  int errnum = Z_OK;
  const char* msg = gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END && errnum != Z_BUF_ERROR)
    throw std::runtime_error(path + " cannot be read: damaged gzip data (" + std::string(msg) + ")");
  return got;
}

}  // namespace

idx_array read_idx(const std::string& path, idx_kind kind) {
  errno = 0;
  gz_ptr f(gzopen(path.c_str(), "rb"));
  if (!f) {
    if (errno == ENOENT)
      throw std::runtime_error("IDX file " + path +
                               " not found: install Debian's dataset-fashion-mnist (scripts/setup.sh)");
    throw std::runtime_error("IDX file " + path + " cannot be opened: " +
                             (errno ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(f.get(), 1 << 17);

  const int rank = rank_of(kind);
  const int64_t header_bytes = 4 + 4 * int64_t{rank};
  uint8_t header[16] = {};
  int64_t got = read_some(f.get(), path, header, 4);
  if (got < 4)
    throw std::runtime_error(path + " is not an IDX " + std::string(kind_name(kind)) + " file: it ends after " +
                             std::to_string(got) + " bytes, inside its " + std::to_string(header_bytes) +
                             "-byte header");
  const uint32_t magic = load_be32(header);
  if (magic != magic_of(kind))
    throw std::runtime_error(path + " is not an IDX " + std::string(kind_name(kind)) + " file (magic " +
                             hex32(magic) + ", expected " + hex32(magic_of(kind)) + ")");
  got += read_some(f.get(), path, header + 4, header_bytes - 4);
  if (got < header_bytes)
    throw std::runtime_error(path + " ends after " + std::to_string(got) + " bytes, inside its " +
                             std::to_string(header_bytes) + "-byte header");

  idx_array out;
  int64_t payload = 1;
  for (int d = 0; d < rank; ++d) {
    auto n = static_cast<int64_t>(load_be32(header + 4 + 4 * d));
    // Dimensions after the count are the size of one item: zero would make every item empty.
    if (d > 0 && n == 0)
      throw std::runtime_error(path + " declares images of " + std::to_string(load_be32(header + 8)) + "x" +
                               std::to_string(load_be32(header + 12)) +
                               " pixels: rows and columns must be at least 1");
    out.dims.push_back(n);
    // Each factor is below 2^32 and the running product stays at most 2^31, so no overflow.
    payload *= n;
    if (payload > max_idx_payload)
      throw std::runtime_error(path + " declares more than " + std::to_string(max_idx_payload) +
                               " bytes of data, beyond what this reader accepts (a damaged header?)");
  }

  // Grow with the bytes that actually arrive rather than reserving what the header claims.
  constexpr int64_t chunk = int64_t{1} << 20;
  int64_t have = 0;
  while (have < payload) {
    int64_t want = std::min(chunk, payload - have);
    out.data.resize(static_cast<size_t>(have + want));
    int64_t n = read_some(f.get(), path, out.data.data() + have, want);
    have += n;
    if (n < want) break;
  }
  if (have < payload)
    throw std::runtime_error(path + " ends after " + std::to_string(header_bytes + have) + " of " +
                             std::to_string(header_bytes + payload) + " bytes (truncated: its header declares " +
                             std::to_string(payload) + " bytes of data)");

  // Count what follows without keeping it: a longer file means the header is wrong.
  int64_t trailing = 0;
  uint8_t scratch[1 << 14];
  for (int64_t n; (n = read_some(f.get(), path, scratch, sizeof scratch)) > 0;) trailing += n;
  if (trailing > 0)
    throw std::runtime_error(path + " has " + std::to_string(trailing) + " bytes after the " +
                             std::to_string(payload) + " bytes of data its header declares");
  return out;
}

std::string encode_idx(idx_kind kind, const std::vector<int64_t>& dims, const std::vector<uint8_t>& data) {
  if (static_cast<int>(dims.size()) != rank_of(kind))
    throw std::invalid_argument("an IDX " + std::string(kind_name(kind)) + " array has " +
                                std::to_string(rank_of(kind)) + " dimensions, got " + std::to_string(dims.size()));
  int64_t payload = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > int64_t{0xffffffff})
      throw std::invalid_argument("IDX dimension " + std::to_string(d) + " does not fit an unsigned 32-bit field");
    payload *= d;
  }
  if (payload != static_cast<int64_t>(data.size()))
    throw std::invalid_argument("IDX dimensions hold " + std::to_string(payload) + " bytes, but " +
                                std::to_string(data.size()) + " were given");
  std::string out;
  auto put32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
  };
  put32(magic_of(kind));
  for (int64_t d : dims) put32(static_cast<uint32_t>(d));
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  return out;
}

}  // namespace fusion
