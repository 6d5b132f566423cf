#include "core/token_shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace fusion {

namespace {

// Little-endian reads and writes whatever the host (the format is little-endian).
int32_t get_i32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}
void put_u32(unsigned char* p, uint32_t v) {
  for (int k = 0; k < 4; ++k) p[k] = static_cast<unsigned char>(v >> (8 * k));
}

}  // namespace

int shard_width_for(int64_t vocab) noexcept { return vocab <= 65536 ? 2 : 4; }

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int width) {
  if (width != 2 && width != 4) throw std::invalid_argument("a token shard holds 2 or 4 bytes per token");
  if (static_cast<int64_t>(tokens.size()) > shard_max_tokens)
    throw std::runtime_error(path + ": " + std::to_string(tokens.size()) + " tokens, more than a shard holds (" +
                             std::to_string(shard_max_tokens) + ")");
  const int64_t limit = width == 2 ? 65536 : INT64_C(4294967296);
  std::vector<unsigned char> bytes(shard_header_bytes + tokens.size() * static_cast<size_t>(width), 0);
  put_u32(bytes.data(), static_cast<uint32_t>(width == 2 ? shard_magic_u16 : shard_magic_u32));
  put_u32(bytes.data() + 4, static_cast<uint32_t>(width == 2 ? shard_version_u16 : shard_version_u32));
  put_u32(bytes.data() + 8, static_cast<uint32_t>(tokens.size()));
  unsigned char* p = bytes.data() + shard_header_bytes;
  for (size_t i = 0; i < tokens.size(); ++i, p += width) {
    int64_t t = tokens[i];
    if (t < 0 || t >= limit)
      throw std::runtime_error(path + ": token " + std::to_string(t) + " at position " + std::to_string(i) +
                               " does not fit " + std::to_string(width * 8) + "-bit tokens");
    for (int k = 0; k < width; ++k) p[k] = static_cast<unsigned char>(static_cast<uint64_t>(t) >> (8 * k));
  }
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(path + ": cannot write token shard: " + std::strerror(errno));
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": error writing token shard (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot write token shard: " + std::strerror(e));
  }
}

token_shard::token_shard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open token shard: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot read token shard: " + std::strerror(e));
  }
  const auto file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < shard_header_bytes) {
    ::close(fd);
    throw std::runtime_error(path + ": offset " + std::to_string(file_bytes) + ": the file ends inside the " +
                             std::to_string(shard_header_bytes) + "-byte header of a token shard (truncated, or not a shard)");
  }
  void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw std::runtime_error(path + ": cannot map token shard: " + std::strerror(errno));
  map_ = std::shared_ptr<const unsigned char>(static_cast<const unsigned char*>(m),
                                              [file_bytes](const unsigned char* q) { ::munmap(const_cast<unsigned char*>(q), file_bytes); });
  const unsigned char* h = map_.get();
  const int32_t magic = get_i32(h), version = get_i32(h + 4), count = get_i32(h + 8);
  auto fail = [&](size_t offset, const std::string& what) {
    throw std::runtime_error(path + ": offset " + std::to_string(offset) + ": " + what);
  };
  if (magic == shard_magic_u16)
    width_ = 2;
  else if (magic == shard_magic_u32)
    width_ = 4;
  else
    fail(0, "magic number " + std::to_string(magic) + " is not a token shard's (" + std::to_string(shard_magic_u16) +
                " for uint16 tokens, " + std::to_string(shard_magic_u32) + " for uint32; llm.c's format)");
  const int32_t want = width_ == 2 ? shard_version_u16 : shard_version_u32;
  if (version != want)
    fail(4, "version " + std::to_string(version) + " with magic " + std::to_string(magic) + ": only version " +
                std::to_string(want) + " is known");
  if (count < 0) fail(8, "token count " + std::to_string(count) + " is negative");
  size_ = count;
  const size_t need = shard_header_bytes + static_cast<size_t>(count) * static_cast<size_t>(width_);
  if (file_bytes < need)
    fail(file_bytes, "the header says " + std::to_string(count) + " tokens (" + std::to_string(need) +
                         " bytes with the header) but the file ends here: truncated");
  if (file_bytes > need)
    fail(need, "the header says " + std::to_string(count) + " tokens but " + std::to_string(file_bytes - need) +
                   " more bytes follow them");
}

void token_shard::read(int64_t first, int64_t n, int32_t* out, int64_t vocab) const {
  if (first < 0 || n < 0 || first + n > size_)
    throw std::out_of_range(path_ + ": tokens [" + std::to_string(first) + ", " + std::to_string(first + n) +
                            ") of a shard of " + std::to_string(size_));
  const unsigned char* p = map_.get() + shard_header_bytes + static_cast<size_t>(first) * static_cast<size_t>(width_);
  for (int64_t i = 0; i < n; ++i, p += width_) {
    int64_t t = width_ == 2 ? static_cast<int64_t>(p[0] | p[1] << 8)
                            : static_cast<int64_t>(static_cast<uint32_t>(get_i32(p)));
    if (t >= vocab)
      throw std::runtime_error(path_ + ": offset " +
                               std::to_string(shard_header_bytes + static_cast<size_t>(first + i) * static_cast<size_t>(width_)) +
                               ": token " + std::to_string(t) + " is beyond the model's vocabulary of " +
                               std::to_string(vocab) + " tokens");
    out[i] = static_cast<int32_t>(t);
  }
}

int64_t token_shard::max_token() const {
  int64_t m = -1;
  const unsigned char* p = map_.get() + shard_header_bytes;
  for (int64_t i = 0; i < size_; ++i, p += width_)
    m = std::max<int64_t>(m, width_ == 2 ? static_cast<int64_t>(p[0] | p[1] << 8) : static_cast<uint32_t>(get_i32(p)));
  return m;
}

}  // namespace fusion
