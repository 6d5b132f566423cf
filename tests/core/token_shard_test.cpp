// Tests of token shards in llm.c's format and of the token data source: a shard written by
// hand from the format's description, every malformed shard named with its offset, the
// deterministic shuffle and the exact resume of training windows, validation batches and
// bytes per token.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/data.hpp"
#include "core/token_shard.hpp"
#include "core/token_source.hpp"
#include "tests/support/error_text.hpp"

using namespace fusion;
using fusion::test::contains;
using fusion::test::error_of;
namespace fs = std::filesystem;

namespace {

struct scratch {
  fs::path dir;
  explicit scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("fusion_shard_test_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& f) const { return (dir / f).string(); }
};

// A shard as llm.c's data_common.py writes it: 256 int32 (magic, version, count, zeros), then
// the tokens, little-endian, written here byte by byte from that description.
std::string hand_shard(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens, int width) {
  std::string bytes(1024, '\0');
  auto put = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + k] = static_cast<char>((v >> (8 * k)) & 0xff);
  };
  put(0, static_cast<uint32_t>(magic));
  put(4, static_cast<uint32_t>(version));
  put(8, static_cast<uint32_t>(count));
  for (uint32_t t : tokens)
    for (int k = 0; k < width; ++k) bytes += static_cast<char>((t >> (8 * k)) & 0xff);
  return bytes;
}

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::vector<int32_t> read_all(const token_shard& s, int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.read(0, s.size(), out.data(), vocab);
  return out;
}

}  // namespace

TEST_CASE("core/token_shard: a shard written by hand from llm.c's format loads unchanged") {
  scratch d("hand");
  write(d / "tiny_train.bin", hand_shard(20240520, 1, 5, {50256, 15496, 995, 0, 65535}, 2));
  token_shard s(d / "tiny_train.bin");
  CHECK(s.size() == 5);
  CHECK(s.width() == 2);
  CHECK(read_all(s, 65536) == std::vector<int32_t>{50256, 15496, 995, 0, 65535});
  CHECK(s.max_token() == 65535);
  // llm.c's LLaMA-3 shards: uint32 tokens.
  write(d / "big_train.bin", hand_shard(20240801, 7, 3, {128000, 70000, 1}, 4));
  token_shard b(d / "big_train.bin");
  CHECK(b.width() == 4);
  CHECK(read_all(b, 128256) == std::vector<int32_t>{128000, 70000, 1});
  // What write_token_shard writes is byte for byte the hand-written file.
  std::vector<int32_t> toks = {50256, 15496, 995, 0, 65535};
  write_token_shard(d / "again.bin", toks, 2);
  std::ifstream a(d / "again.bin", std::ios::binary);
  std::string written{std::istreambuf_iterator<char>(a), std::istreambuf_iterator<char>()};
  CHECK(written == hand_shard(20240520, 1, 5, {50256, 15496, 995, 0, 65535}, 2));
  CHECK(shard_width_for(50257) == 2);
  CHECK(shard_width_for(65536) == 2);
  CHECK(shard_width_for(65537) == 4);
}

TEST_CASE("core/token_shard: malformed shards are errors naming the file and offset") {
  scratch d("bad");
  write(d / "magic.bin", hand_shard(20240521, 1, 2, {1, 2}, 2));
  auto msg = error_of([&] { token_shard s(d / "magic.bin"); });
  CHECK(contains(msg, d / "magic.bin"));
  CHECK(contains(msg, "offset 0: magic number 20240521 is not a token shard's"));
  write(d / "version.bin", hand_shard(20240520, 2, 2, {1, 2}, 2));
  CHECK(contains(error_of([&] { token_shard s(d / "version.bin"); }), "offset 4: version 2"));
  // The header promises 10 tokens, the file holds 4: truncated.
  write(d / "short.bin", hand_shard(20240520, 1, 10, {1, 2, 3, 4}, 2));
  msg = error_of([&] { token_shard s(d / "short.bin"); });
  CHECK(contains(msg, d / "short.bin" + ": offset 1032: the header says 10 tokens"));
  CHECK(contains(msg, "truncated"));
  write(d / "header.bin", std::string(100, '\0'));
  CHECK(contains(error_of([&] { token_shard s(d / "header.bin"); }), "offset 100: the file ends inside the 1024-byte header"));
  write(d / "long.bin", hand_shard(20240520, 1, 1, {1, 2}, 2));
  CHECK(contains(error_of([&] { token_shard s(d / "long.bin"); }), "offset 1026: the header says 1 tokens but 2 more bytes"));
  write(d / "negative.bin", hand_shard(20240520, 1, -3, {}, 2));
  CHECK(contains(error_of([&] { token_shard s(d / "negative.bin"); }), "offset 8: token count -3 is negative"));
  CHECK(contains(error_of([&] { token_shard s(d / "missing.bin"); }), "cannot open token shard"));
  // A token beyond the model's vocabulary: named with its offset, never clamped.
  write(d / "vocab.bin", hand_shard(20240520, 1, 4, {1, 2, 64, 3}, 2));
  token_shard v(d / "vocab.bin");
  std::vector<int32_t> out(4);
  msg = error_of([&] { v.read(0, 4, out.data(), 64); });
  CHECK(contains(msg, d / "vocab.bin" + ": offset 1028: token 64 is beyond the model's vocabulary of 64 tokens"));
  CHECK(error_of([&] { v.read(0, 4, out.data(), 65); }).empty());
  // Tokens that do not fit the width are refused when writing.
  std::vector<int32_t> big = {70000};
  CHECK(contains(error_of([&] { write_token_shard(d / "w.bin", big, 2); }), "does not fit 16-bit tokens"));
}

TEST_CASE("core/token_source: permutation, shuffled windows, exact resume, validation") {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 64ull, 1000ull, 4097ull}) {
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(permute_index(i, n, 99));
    CHECK(seen.size() == n);
    CHECK(*seen.rbegin() == n - 1);
  }
  scratch d("source");
  const int64_t T = 8;
  // Two training shards (tokens = their position, so a window shows where it came from) and a
  // validation shard.
  std::vector<int32_t> a(41), b(25), v(40);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 1000);
  std::iota(v.begin(), v.end(), 2000);
  write_token_shard(d / "c_train_000000.bin", a, 2);
  write_token_shard(d / "c_train_000001.bin", b, 2);
  write_token_shard(d / "c_val_000000.bin", v, 2);
  write(d / "notes.txt", "not a shard");
  auto files = find_shards(d.dir.string());
  CHECK(files.train.size() == 2);
  CHECK(files.val.size() == 1);
  std::vector<uint32_t> bytes(3000, 2);  // every token 2 bytes long
  token_source src(files, T, 3000, bytes, d.dir.string());
  CHECK(src.train_windows() == 5 + 3);  // (41-1)/8 + (25-1)/8
  CHECK(src.val_windows() == 4);
  // One epoch of 8 rows visits every window once.
  const int64_t B = 4;
  std::set<int64_t> epoch;
  for (uint64_t step = 0; step < 2; ++step)
    for (int64_t r = 0; r < B; ++r) epoch.insert(src.train_window(7, step, B, r));
  CHECK(epoch.size() == 8);
  // Another seed, another order.
  std::vector<int64_t> o7, o8;
  for (int64_t r = 0; r < 8; ++r) o7.push_back(src.train_window(7, 0, 8, r)), o8.push_back(src.train_window(8, 0, 8, r));
  CHECK(o7 != o8);
  // A batch: y is x shifted by one, within one shard.
  auto batch = [&](const token_source& s, uint64_t seed, uint64_t step) {
    tensor x = tensor::uninitialized({B, T}, dtype::i32), y = tensor::uninitialized({B, T}, dtype::i32);
    tensor* out[] = {&x, &y};
    s.train_batch(seed, step, out);
    return std::pair{std::vector<int32_t>(x.i32(), x.i32() + B * T), std::vector<int32_t>(y.i32(), y.i32() + B * T)};
  };
  auto [x, y] = batch(src, 7, 5);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) {
      CHECK(y[r * T + t] == x[r * T + t] + 1);
      const int32_t first = x[r * T];
      CHECK((first < 1000 ? first : first - 1000) % T == 0);  // windows start T apart
    }
  // Resume: a source opened afresh (a resumed run) reads at step 5 what the first one read.
  token_source again(find_shards(d.dir.string()), T, 3000, bytes, d.dir.string());
  CHECK(batch(again, 7, 5) == batch(src, 7, 5));
  CHECK(batch(again, 7, 6) != batch(src, 7, 5));
  // Validation: one batch of 4 windows, in order.
  CHECK(src.eval_batches(4) == 1);
  tensor vx = tensor::uninitialized({4, T}, dtype::i32), vy = tensor::uninitialized({4, T}, dtype::i32);
  tensor* vout[] = {&vx, &vy};
  src.eval_batch(0, vout);
  CHECK(vx.i32()[0] == 2000);
  CHECK(vx.i32()[T] == 2008);
  CHECK(vy.i32()[4 * T - 1] == 2032);
  CHECK(src.eval_bytes_per_token(1, 4) == doctest::Approx(2.0));
  CHECK(contains(error_of([&] { src.eval_batches(5); }), "fewer than one batch of 5"));
  CHECK(contains(src.describe(), "66 training tokens in 2 shards, 40 validation tokens"));
  // A token beyond the model's vocabulary stops the batch that reads it.
  token_source small(files, T, 1010, bytes, d.dir.string());
  bool hit = false;
  for (uint64_t step = 0; step < 4 && !hit; ++step) hit = contains(error_of([&] { batch(small, 7, step); }), "c_train_000001.bin: offset");
  CHECK(hit);
  CHECK(contains(error_of([&] { find_shards((d.dir / "none").string()); }), "not found"));
  fs::remove(d / "c_train_000000.bin");
  fs::remove(d / "c_train_000001.bin");
  CHECK(contains(error_of([&] { find_shards(d.dir.string()); }), "no training shard"));
}
