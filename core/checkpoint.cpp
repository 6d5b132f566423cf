// Checkpoint writer and reader (format in checkpoint.hpp) and the XXH64 checksum.
// Shape legend: none.
#include "core/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>

namespace fusion {

// Tensor payloads are written as the host's raw element bytes.
static_assert(std::endian::native == std::endian::little, "checkpoint format assumes a little-endian host");

namespace {

constexpr char magic[8] = {'F', 'U', 'S', 'N', 'C', 'K', 'P', 'T'};
constexpr uint32_t format_version = 1;
constexpr uint32_t max_name_len = 4096;
constexpr uint8_t max_rank = 16;
constexpr size_t header_bytes = 8 + 4 + 4 + 8 + 8 + 4;   // up to and including tensor count
constexpr size_t trailer_bytes = 8;
constexpr size_t min_tensor_entry = 4 + 1 + 1 + 1 + 2 + 8;  // name >= 1 byte, rank 0
constexpr size_t io_chunk = size_t{8} << 20;  // hashed while still in cache

// ---- little-endian field encoding ----
void put_u(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_str(std::string& out, const std::string& s) {
  put_u(out, s.size(), 4);
  out += s;
}

std::string errno_text() { return std::strerror(errno); }

// Reads fields from the file, never past its known size, hashing every byte it consumes.
class reader {
 public:
  reader(std::FILE* f, const std::string& path, uint64_t size) : f_(f), path_(path), size_(size) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("checkpoint " + path_ + ": " + what);
  }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t pos() const { return pos_; }
  const xxh64_hasher& hash() const { return hash_; }

  void bytes(void* dst, uint64_t n, const char* field) {
    if (n > remaining())
      fail(std::string("truncated: ") + field + " at offset " + std::to_string(pos_) + " needs " +
           std::to_string(n) + " bytes, only " + std::to_string(remaining()) + " left");
    auto* d = static_cast<unsigned char*>(dst);
    for (uint64_t done = 0; done < n;) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(io_chunk, n - done));
      if (std::fread(d + done, 1, want, f_) != want)
        fail(std::string("read error in ") + field + " at offset " + std::to_string(pos_ + done) +
             (std::ferror(f_) ? ": " + errno_text() : ": unexpected end of file"));
      hash_.update(d + done, want);
      done += want;
    }
    pos_ += n;
  }
  uint64_t u(int width, const char* field) {
    unsigned char b[8] = {};
    bytes(b, static_cast<uint64_t>(width), field);
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::string str(uint64_t len, const char* field) {
    if (len > remaining())
      fail(std::string("absurd ") + field + " length " + std::to_string(len) + " at offset " +
           std::to_string(pos_) + ": only " + std::to_string(remaining()) + " bytes left");
    std::string s(static_cast<size_t>(len), '\0');
    bytes(s.data(), len, field);
    return s;
  }

 private:
  std::FILE* f_;
  const std::string& path_;
  uint64_t size_;
  uint64_t pos_ = 0;
  xxh64_hasher hash_;
};

using file_ptr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// True when every element is finite. Branch-free over the exponent bits (all ones: NaN or
// infinity), so the scan vectorises and runs at memory speed, and it stays right under
// -ffast-math, where std::isfinite may be folded to true.
template <class Bits>
bool all_finite_bits(const std::byte* data, int64_t n, Bits exponent) {
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, data + i * static_cast<int64_t>(sizeof v), sizeof v);
    bad |= static_cast<Bits>((v & exponent) == exponent);
  }
  return bad == 0;
}

bool all_finite(const tensor& t) {
  if (t.is_cuda()) return all_finite(t.to_cpu());
  switch (t.type()) {
    case dtype::f32: return all_finite_bits<uint32_t>(t.bytes(), t.numel(), 0x7f800000u);
    case dtype::f64: return all_finite_bits<uint64_t>(t.bytes(), t.numel(), 0x7ff0000000000000ull);
    case dtype::i32: return true;
  }
  return true;
}

}  // namespace

// ---- xxh64 -----------------------------------------------------------------------------------

void xxh64_hasher::state_deleter::operator()(XXH64_state_s* s) const { XXH64_freeState(s); }

xxh64_hasher::xxh64_hasher(uint64_t seed) : state_(XXH64_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH64_reset(state_.get(), seed);
}

void xxh64_hasher::update(const void* data, size_t len) { XXH64_update(state_.get(), data, len); }

uint64_t xxh64_hasher::digest() const { return XXH64_digest(state_.get()); }

uint64_t xxh64(std::span<const std::byte> data, uint64_t seed) { return XXH64(data.data(), data.size(), seed); }

// ---- save ------------------------------------------------------------------------------------

void save_checkpoint(const std::string& path, const checkpoint& ckpt) {
  std::set<std::string> names;
  uint64_t file_size = header_bytes + 4 + ckpt.model_name.size() + 4 + ckpt.meta.size() + trailer_bytes;
  for (const auto& [name, t] : ckpt.tensors) {
    if (name.empty() || name.size() > max_name_len)
      throw std::invalid_argument("save_checkpoint " + path + ": tensor name \"" + name.substr(0, 64) +
                                  "\" must have 1.." + std::to_string(max_name_len) + " bytes");
    if (!names.insert(name).second)
      throw std::invalid_argument("save_checkpoint " + path + ": duplicate tensor name \"" + name + "\"");
    if (t.empty()) throw std::invalid_argument("save_checkpoint " + path + ": tensor \"" + name + "\" has no storage");
    if (t.rank() > max_rank)
      throw std::invalid_argument("save_checkpoint " + path + ": tensor \"" + name + "\" has rank " +
                                  std::to_string(t.rank()) + " > " + std::to_string(max_rank));
    file_size += 4 + name.size() + 4 + 8 * t.rank() + 8 + t.nbytes();
  }
  // Before the temporary file is created: a refused checkpoint leaves `path` as it was.
  if (auto bad = first_non_finite(ckpt))
    throw std::invalid_argument("save_checkpoint " + path + ": tensor \"" + *bad +
                                "\" holds NaN or infinity; not written, the file is left as it was");
  if (ckpt.model_name.size() > UINT32_MAX || ckpt.meta.size() > UINT32_MAX || ckpt.tensors.size() > UINT32_MAX)
    throw std::invalid_argument("save_checkpoint " + path + ": model name, meta or tensor count too large");

  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    std::remove(tmp.c_str());
    throw std::runtime_error("checkpoint " + path + ": " + what);
  };
  file_ptr f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) fail("cannot create " + tmp + ": " + errno_text());

  xxh64_hasher hash;
  std::string buf;  // small fields are gathered here and written in one call
  auto write = [&](const void* data, size_t n) {
    hash.update(data, n);
    if (n && std::fwrite(data, 1, n, f.get()) != n) fail("write to " + tmp + " failed: " + errno_text());
  };
  auto flush_buf = [&] {
    write(buf.data(), buf.size());
    buf.clear();
  };

  buf.append(magic, sizeof magic);
  put_u(buf, format_version, 4);
  put_u(buf, 0, 4);
  put_u(buf, file_size, 8);
  put_u(buf, ckpt.step, 8);
  put_u(buf, ckpt.tensors.size(), 4);
  put_str(buf, ckpt.model_name);
  put_str(buf, ckpt.meta);
  for (const auto& [name, t] : ckpt.tensors) {
    put_str(buf, name);
    put_u(buf, static_cast<uint8_t>(t.type()), 1);
    put_u(buf, t.rank(), 1);
    put_u(buf, 0, 2);
    for (int64_t d : t.shape()) put_u(buf, static_cast<uint64_t>(d), 8);
    put_u(buf, t.nbytes(), 8);
    if (buf.size() + t.nbytes() < (size_t{1} << 20)) {
      buf.append(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
    } else {
      flush_buf();
      for (size_t done = 0; done < t.nbytes(); done += io_chunk)
        write(t.bytes() + done, std::min(io_chunk, t.nbytes() - done));
    }
  }
  flush_buf();
  put_u(buf, hash.digest(), 8);
  if (std::fwrite(buf.data(), 1, buf.size(), f.get()) != buf.size()) fail("write to " + tmp + " failed: " + errno_text());

  // Data must be on disk before the rename publishes it, or a crash could expose an empty file.
  if (std::fflush(f.get()) != 0 || ::fsync(fileno(f.get())) != 0) fail("flushing " + tmp + " failed: " + errno_text());
  if (std::fclose(f.release()) != 0) fail("closing " + tmp + " failed: " + errno_text());
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming " + tmp + " failed: " + errno_text());

  // Persist the rename itself; best effort (some file systems refuse to fsync a directory).
  auto slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// ---- load ------------------------------------------------------------------------------------

checkpoint load_checkpoint(const std::string& path) {
  file_ptr f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    if (errno == ENOENT) throw std::runtime_error("checkpoint " + path + ": file not found");
    throw std::runtime_error("checkpoint " + path + ": cannot open: " + errno_text());
  }
  struct stat st {};
  if (::fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode))
    throw std::runtime_error("checkpoint " + path + ": not a regular file");
  const auto actual_size = static_cast<uint64_t>(st.st_size);

  reader in(f.get(), path, actual_size);
  char m[sizeof magic];
  if (actual_size < sizeof magic) in.fail("truncated: " + std::to_string(actual_size) + " bytes is too short to be a checkpoint");
  in.bytes(m, sizeof m, "magic");
  if (std::memcmp(m, magic, sizeof magic) != 0) in.fail("bad magic: not a FusionLLM checkpoint (expected \"FUSNCKPT\")");
  auto version = in.u(4, "format version");
  if (version != format_version)
    in.fail("unsupported format version " + std::to_string(version) + " (this build reads version " +
            std::to_string(format_version) + ")");
  if (auto flags = in.u(4, "flags"); flags != 0) in.fail("unsupported flags " + std::to_string(flags));
  auto declared_size = in.u(8, "file size");
  if (declared_size > actual_size)
    in.fail("truncated: header says " + std::to_string(declared_size) + " bytes, file has " + std::to_string(actual_size));
  if (declared_size < actual_size)
    in.fail("file has " + std::to_string(actual_size) + " bytes, header says " + std::to_string(declared_size) +
            " (trailing data)");

  checkpoint ckpt;
  ckpt.step = in.u(8, "step");
  auto count = in.u(4, "tensor count");
  if (count > in.remaining() / min_tensor_entry)
    in.fail("absurd tensor count " + std::to_string(count) + " for a file of " + std::to_string(actual_size) + " bytes");
  ckpt.model_name = in.str(in.u(4, "model name length"), "model name");
  ckpt.meta = in.str(in.u(4, "meta length"), "meta");
  ckpt.tensors.reserve(static_cast<size_t>(count));
  std::set<std::string> names;

  for (uint64_t k = 0; k < count; ++k) {
    const std::string where = "tensor #" + std::to_string(k);
    auto name_len = in.u(4, "tensor name length");
    if (name_len == 0 || name_len > max_name_len)
      in.fail("absurd name length " + std::to_string(name_len) + " of " + where);
    std::string name = in.str(name_len, "tensor name");
    const std::string what = where + " \"" + name + "\"";
    if (!names.insert(name).second) in.fail("duplicate tensor name in " + what);
    auto type = in.u(1, "dtype");
    if (type > static_cast<uint8_t>(dtype::f64)) in.fail("unknown dtype " + std::to_string(type) + " of " + what);
    auto rank = in.u(1, "rank");
    if (rank > max_rank) in.fail("absurd rank " + std::to_string(rank) + " of " + what);
    if (in.u(2, "reserved") != 0) in.fail("nonzero reserved field of " + what);

    const auto dt = static_cast<dtype>(type);
    // Bound the element count by the bytes left before building anything from it; the product
    // of the nonzero dims is capped too, so no intermediate product can overflow.
    const uint64_t max_elems = in.remaining() / dtype_size(dt);
    shape_t shape(static_cast<size_t>(rank));
    uint64_t nonzero_product = 1;
    bool has_zero = false;
    for (auto& d : shape) {
      auto raw = in.u(8, "dim");
      if (raw > (uint64_t{1} << 48)) in.fail("absurd dimension " + std::to_string(static_cast<int64_t>(raw)) + " of " + what);
      d = static_cast<int64_t>(raw);
      if (raw == 0) {
        has_zero = true;
      } else if (nonzero_product > max_elems / raw) {
        in.fail("absurd shape of " + what + ": more elements than the file holds");
      } else {
        nonzero_product *= raw;
      }
    }
    const uint64_t numel = has_zero ? 0 : nonzero_product;
    auto nbytes = in.u(8, "data length");
    if (nbytes != numel * dtype_size(dt))
      in.fail("data length " + std::to_string(nbytes) + " of " + what + " does not match shape " + to_string(shape) +
              " (" + std::to_string(numel * dtype_size(dt)) + " bytes)");
    if (nbytes > in.remaining()) in.fail("truncated: data of " + what + " runs past the end of the file");

    tensor t(std::move(shape), dt);
    in.bytes(t.bytes(), nbytes, "tensor data");
    ckpt.tensors.emplace_back(std::move(name), std::move(t));
  }

  if (in.remaining() != trailer_bytes)
    in.fail("malformed: " + std::to_string(in.remaining()) + " bytes after the last tensor, expected the " +
            std::to_string(trailer_bytes) + "-byte checksum");
  const uint64_t computed = in.hash().digest();
  const uint64_t stored = in.u(8, "checksum");
  if (stored != computed) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored %016llx, computed %016llx): file is corrupt",
                  static_cast<unsigned long long>(stored), static_cast<unsigned long long>(computed));
    in.fail(buf);
  }
  return ckpt;
}

std::optional<std::string> first_non_finite(const checkpoint& ckpt) {
  for (const auto& [name, t] : ckpt.tensors)
    if (!t.empty() && !all_finite(t)) return name;
  return std::nullopt;
}

uint64_t tensor_hash(const tensor& t) {
  xxh64_hasher h;
  const auto type = static_cast<uint8_t>(t.type());
  h.update(&type, 1);
  for (int64_t d : t.shape()) h.update(&d, sizeof d);
  if (!t.empty()) h.update(t.bytes(), t.nbytes());
  return h.digest();
}

std::optional<std::string> replica_divergence(const std::string& op, const std::vector<replica_state>& replicas,
                                              const std::vector<std::string>& skip) {
  if (replicas.size() < 2 || !replicas[0].tensors) return std::nullopt;
  auto skipped = [&](const std::string& name) { return std::find(skip.begin(), skip.end(), name) != skip.end(); };
  auto differ = [&](const replica_state& other, const std::string& name) {
    return "replicas of op '" + op + "' diverged: node " + replicas[0].node + " and node " + other.node +
           " differ in " + name;
  };
  for (const auto& [name, t] : *replicas[0].tensors) {
    if (skipped(name)) continue;
    const uint64_t want = tensor_hash(t);
    for (size_t r = 1; r < replicas.size(); ++r) {
      const auto* theirs = replicas[r].tensors;
      const tensor* same = nullptr;
      if (theirs)
        for (const auto& [n, u] : *theirs)
          if (n == name) same = &u;
      if (!same || tensor_hash(*same) != want) return differ(replicas[r], name);
    }
  }
  for (size_t r = 1; r < replicas.size(); ++r) {
    if (!replicas[r].tensors) return differ(replicas[r], "every tensor (it sent no state)");
    for (const auto& [name, u] : *replicas[r].tensors) {
      (void)u;
      if (skipped(name)) continue;
      bool known = false;
      for (const auto& [n, t] : *replicas[0].tensors) known = known || n == name;
      if (!known) return differ(replicas[r], name);
    }
  }
  return std::nullopt;
}

const tensor* find_tensor(const checkpoint& ckpt, const std::string& name) {
  for (const auto& [n, t] : ckpt.tensors)
    if (n == name) return &t;
  return nullptr;
}

void average_replica_buffers(std::vector<std::pair<std::string, tensor>>& first,
                             const std::vector<const std::vector<std::pair<std::string, tensor>>*>& others,
                             const std::vector<std::string>& keys, const std::vector<double>& weights) {
  if (weights.size() != others.size() + 1)
    throw std::invalid_argument("average_replica_buffers: one weight per replica");
  for (auto& [name, t] : first) {
    if (std::find(keys.begin(), keys.end(), name) == keys.end() || t.type() != dtype::f32) continue;
    std::vector<const tensor*> theirs;
    for (const auto* o : others) {
      const tensor* same = nullptr;
      for (const auto& [n, u] : *o)
        if (n == name && u.type() == dtype::f32 && u.shape() == t.shape()) same = &u;
      if (!same) break;
      theirs.push_back(same);
    }
    if (theirs.size() != others.size()) continue;
    double total = weights[0];
    for (size_t k = 0; k < theirs.size(); ++k) total += weights[k + 1];
    if (!(total > 0)) continue;
    auto out = t.f32_span();
    for (size_t i = 0; i < out.size(); ++i) {
      double sum = weights[0] * out[i];
      for (size_t k = 0; k < theirs.size(); ++k) sum += weights[k + 1] * theirs[k]->f32_span()[i];
      out[i] = static_cast<float>(sum / total);
    }
  }
}

}  // namespace fusion
