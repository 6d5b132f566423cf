// Tests of the checkpoint file: round trip, atomic replacement, and one error per corruption.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"

using namespace fusion;
namespace fs = std::filesystem;

namespace {

fs::path scratch_path(const std::string& name) {
  return fs::temp_directory_path() / ("fusion_ckpt_test_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

std::string load_error(const fs::path& p) {
  try {
    load_checkpoint(p.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

uint64_t hash_of(const std::string& s, uint64_t seed = 0) {
  return xxh64(std::as_bytes(std::span(s.data(), s.size())), seed);
}

void put_u64(std::string& bytes, size_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// A checkpoint with one tensor of each kind the tests care about.
checkpoint sample_checkpoint() {
  checkpoint c;
  c.step = 123456789012345ULL;
  c.model_name = "gpt-char";
  c.meta = std::string("lr = 0.001\nbatch = 8\n\0binary ok", 31);
  c.tensors.emplace_back("h0.attn.weight", tensor::from({2, 3}, std::vector<float>{1.5f, -2, 3, 4e-20f, 5, -0.0f}));
  c.tensors.emplace_back("step_tokens", tensor::from_i32({4}, std::vector<int32_t>{-1, 0, 2147483647, 7}));
  c.tensors.emplace_back("loss_scale", tensor::from({}, std::vector<float>{0.125f}));
  tensor d({2, 2}, dtype::f64);
  for (int i = 0; i < 4; ++i) d.f64()[i] = 1.0 / (i + 3);
  c.tensors.emplace_back("f64 state", std::move(d));
  c.tensors.emplace_back("empty", tensor({0, 5}));
  return c;
}

// Offset of the first tensor entry in sample_checkpoint()'s file, from the documented layout.
size_t first_tensor_offset() {
  const checkpoint c = sample_checkpoint();
  return 36 + 4 + c.model_name.size() + 4 + c.meta.size();
}

}  // namespace

TEST_CASE("core/checkpoint: xxh64 matches the reference test vectors") {
  CHECK(hash_of("") == 0xEF46DB3751D8E999ULL);
  CHECK(hash_of("a") == 0xD24EC4F1A98C6E5BULL);
  CHECK(hash_of("abc") == 0x44BC2CF5AD770999ULL);
  CHECK(hash_of("Hello, World!") == 0xC49AACF8080FE47FULL);
  CHECK(hash_of("1234567890123456789012345678901") == 0x8F367CB873A5376EULL);
  CHECK(hash_of("12345678901234567890123456789012") == 0x40FD1AA52D98274CULL);
  CHECK(hash_of("The quick brown fox jumps over the lazy dog") == 0x0B242D361FDA71BCULL);
  CHECK(hash_of("abc", 5381) == 0x19D1C1B5C673451FULL);
}

TEST_CASE("core/checkpoint: xxh64 streaming equals one shot for any split") {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>((i * 131 + 17) & 0xff));
  const uint64_t whole = hash_of(data);
  for (size_t piece : {1, 3, 7, 31, 32, 33, 64, 100}) {
    CAPTURE(piece);
    xxh64_hasher h;
    for (size_t off = 0; off < data.size(); off += piece) h.update(data.data() + off, std::min(piece, data.size() - off));
    CHECK(h.digest() == whole);
  }
}

TEST_CASE("core/checkpoint: round trip keeps every field and tensor bit for bit") {
  auto path = scratch_path("round.ckpt");
  const checkpoint c = sample_checkpoint();
  save_checkpoint(path.string(), c);
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  checkpoint back = load_checkpoint(path.string());
  CHECK(back.step == c.step);
  CHECK(back.model_name == c.model_name);
  CHECK(back.meta == c.meta);
  REQUIRE(back.tensors.size() == c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    // Named, not a structured binding: clang 14 (the fuzz and sanitizer builds) cannot capture one.
    const std::string& name = c.tensors[i].first;
    const tensor& t = c.tensors[i].second;
    CAPTURE(name);
    CHECK(back.tensors[i].first == name);
    const tensor& u = back.tensors[i].second;
    CHECK(u.type() == t.type());
    CHECK(u.shape() == t.shape());
    REQUIRE(u.nbytes() == t.nbytes());
    CHECK(std::memcmp(u.bytes(), t.bytes(), t.nbytes()) == 0);
  }
  const tensor* scalar = find_tensor(back, "loss_scale");
  REQUIRE(scalar != nullptr);
  CHECK(scalar->rank() == 0);
  CHECK(scalar->f32()[0] == 0.125f);
  CHECK(find_tensor(back, "missing") == nullptr);

  // The file follows the documented layout.
  std::string bytes = read_bytes(path);
  CHECK(bytes.substr(0, 8) == "FUSNCKPT");
  CHECK(bytes[8] == 1);
  CHECK(static_cast<unsigned char>(bytes[16]) + 256 * static_cast<unsigned char>(bytes[17]) == bytes.size());
  CHECK(bytes.substr(first_tensor_offset() + 4, 14) == "h0.attn.weight");
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  CHECK(stored == hash_of(bytes.substr(0, bytes.size() - 8)));

  // Saving again replaces the file atomically with the new content.
  checkpoint later = c;
  later.step = 7;
  later.tensors.resize(1);
  save_checkpoint(path.string(), later);
  CHECK(load_checkpoint(path.string()).step == 7);
  CHECK(load_checkpoint(path.string()).tensors.size() == 1);
  fs::remove(path);
}

TEST_CASE("core/checkpoint: a large tensor streams through in chunks") {
  auto path = scratch_path("large.ckpt");
  checkpoint c;
  tensor big({5 << 20});  // 20 MB: several I/O chunks and a partial last one
  for (int64_t i = 0; i < big.numel(); ++i) big.f32()[i] = static_cast<float>(i % 9973);
  c.tensors.emplace_back("big", big);
  save_checkpoint(path.string(), c);
  checkpoint back = load_checkpoint(path.string());
  REQUIRE(back.tensors.size() == 1);
  CHECK(std::memcmp(back.tensors[0].second.bytes(), big.bytes(), big.nbytes()) == 0);
  fs::remove(path);
}

TEST_CASE("core/checkpoint: each corruption gives its own error naming the file") {
  auto good = scratch_path("good.ckpt");
  auto bad = scratch_path("bad.ckpt");
  save_checkpoint(good.string(), sample_checkpoint());
  const std::string bytes = read_bytes(good);
  const size_t t0 = first_tensor_offset();  // name length of "h0.attn.weight"
  const size_t dims0 = t0 + 4 + 14 + 4;     // first dim of that tensor
  const size_t data0 = dims0 + 16 + 8;      // its first element

  auto expect_error = [&](const std::string& content, const std::string& what) {
    CAPTURE(what);
    write_bytes(bad, content);
    std::string msg = load_error(bad);
    CHECK(msg.find("checkpoint " + bad.string()) != std::string::npos);
    CHECK(msg.find(what) != std::string::npos);
  };

  CHECK(load_error(scratch_path("nothing_here.ckpt")).find("file not found") != std::string::npos);
  std::string b = bytes;
  b[0] = 'X';
  expect_error(b, "bad magic");
  b = bytes;
  b[8] = 2;
  expect_error(b, "unsupported format version 2");
  expect_error(bytes.substr(0, bytes.size() - 10), "truncated");
  expect_error(bytes.substr(0, 5), "truncated");
  expect_error(bytes.substr(0, 20), "truncated");
  expect_error(bytes + "extra", "trailing data");
  b = bytes;
  b[data0 + 1] ^= 0x10;  // one bit of a weight
  expect_error(b, "checksum mismatch");
  b = bytes;
  b[t0 + 4] = 'H';  // the tensor name is covered too
  expect_error(b, "checksum mismatch");
  b = bytes;
  b[bytes.size() - 1] ^= 1;  // the stored checksum itself
  expect_error(b, "checksum mismatch");
  b = bytes;
  put_u64(b, dims0, uint64_t{1} << 40);  // 2^40 x 3 floats in a file of a few hundred bytes
  expect_error(b, "absurd shape");
  b = bytes;
  put_u64(b, dims0, ~uint64_t{0});  // -1
  expect_error(b, "absurd dimension -1");
  b = bytes;
  b[32] = b[33] = b[34] = b[35] = '\xff';  // tensor count 2^32 - 1
  expect_error(b, "absurd tensor count");
  b = bytes;
  b[36] = b[37] = b[38] = '\xff';  // model name length ~16M
  expect_error(b, "absurd model name length");
  b = bytes;
  b[t0 + 3] = '\x7f';  // tensor name length ~2G
  expect_error(b, "absurd name length");
  b = bytes;
  b[dims0 + 16] += 4;  // data length no longer matches the shape
  expect_error(b, "does not match shape");
  b = bytes;
  b[t0 + 4 + 14] = 9;  // dtype
  expect_error(b, "unknown dtype 9");
  fs::remove(good);
  fs::remove(bad);
}

TEST_CASE("core/checkpoint: save rejects bad names and unwritable places") {
  auto path = scratch_path("reject.ckpt");
  checkpoint c;
  c.tensors.emplace_back("w", tensor({2}));
  c.tensors.emplace_back("w", tensor({3}));
  CHECK_THROWS_AS(save_checkpoint(path.string(), c), std::invalid_argument);
  c.tensors.resize(1);
  c.tensors.emplace_back("", tensor({3}));
  CHECK_THROWS_AS(save_checkpoint(path.string(), c), std::invalid_argument);
  c.tensors.resize(1);
  c.tensors.emplace_back("no storage", tensor());
  CHECK_THROWS_AS(save_checkpoint(path.string(), c), std::invalid_argument);
  CHECK_FALSE(fs::exists(path));
  c.tensors.resize(1);
  const std::string nowhere = scratch_path("no_such_dir").string() + "/x.ckpt";
  try {
    save_checkpoint(nowhere, c);
    FAIL("save into a missing directory must throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find(nowhere) != std::string::npos);
  }
}

TEST_CASE("core/checkpoint: replicas' batch statistics are saved as their mean, weighted by micro-batches") {
  using tensors = std::vector<std::pair<std::string, tensor>>;
  auto state = [](float w, float mean, float var) {
    return tensors{{"bn/w", tensor::from({1}, std::vector<float>{w})},
                   {"bn/running_mean", tensor::from({2}, std::vector<float>{mean, -mean})},
                   {"bn/running_var", tensor::from({1}, std::vector<float>{var})}};
  };
  const std::vector<std::string> keys = {"bn/running_mean", "bn/running_var"};
  tensors a = state(0.5f, 1.0f, 2.0f);
  const tensors b = state(0.5f, 4.0f, 8.0f), c = state(0.5f, 7.0f, 2.0f);
  // Replica a ran 2 micro-batches a step, b and c one each.
  average_replica_buffers(a, {&b, &c}, keys, {2, 1, 1});
  CHECK(a[1].second.f32()[0] == doctest::Approx((2 * 1.0 + 4.0 + 7.0) / 4));
  CHECK(a[1].second.f32()[1] == doctest::Approx(-(2 * 1.0 + 4.0 + 7.0) / 4));
  CHECK(a[2].second.f32()[0] == doctest::Approx((2 * 2.0 + 8.0 + 2.0) / 4));
  CHECK(a[0].second.f32()[0] == 0.5f);  // parameters are not buffers: untouched
  // A replica without the buffer (or with another shape) leaves replica 0's.
  tensors d = state(0.5f, 1.0f, 2.0f);
  const tensors odd = {{"bn/running_mean", tensor::from({1}, std::vector<float>{9.0f})}};
  average_replica_buffers(d, {&odd}, keys, {1, 1});
  CHECK(d[1].second.f32()[0] == 1.0f);
  CHECK(d[2].second.f32()[0] == 2.0f);
  CHECK_THROWS_AS(average_replica_buffers(d, {&odd}, keys, {1}), std::invalid_argument);
}

TEST_CASE("core/checkpoint: replica_divergence names the op, both nodes and the first tensor that differs") {
  using tensors = std::vector<std::pair<std::string, tensor>>;
  auto state = [](float w, float m) {
    return tensors{{"fc/w", tensor::from({2}, std::vector<float>{w, 1.0f})},
                   {"fc/w.m", tensor::from({2}, std::vector<float>{m, 0.0f})},
                   {"fc/running_mean", tensor::from({1}, std::vector<float>{w * m})}};
  };
  const tensors a = state(0.5f, 0.25f), same = state(0.5f, 0.25f), moment = state(0.5f, 0.3f);
  CHECK_FALSE(replica_divergence("fc", {{"a1", &a}, {"a2", &same}, {"a3", &same}}).has_value());
  auto bad = replica_divergence("fc", {{"a1", &a}, {"a2", &same}, {"a3", &moment}});
  REQUIRE(bad.has_value());
  CHECK(*bad == "replicas of op 'fc' diverged: node a1 and node a3 differ in fc/w.m");
  // One bit of difference is a divergence.
  tensors flipped = state(0.5f, 0.25f);
  flipped[0].second.f32()[1] = std::nextafter(1.0f, 2.0f);
  CHECK(replica_divergence("fc", {{"a1", &a}, {"a2", &flipped}}).value_or("") ==
        "replicas of op 'fc' diverged: node a1 and node a2 differ in fc/w");
  // Per-replica buffers (batch statistics) are skipped when asked.
  const tensors other_stats = state(0.5f, 0.25f);
  tensors stats = other_stats;
  stats[2].second = tensor::from({1}, std::vector<float>{7.0f});
  CHECK(replica_divergence("fc", {{"a1", &a}, {"a2", &stats}}).has_value());
  CHECK_FALSE(replica_divergence("fc", {{"a1", &a}, {"a2", &stats}}, {"fc/running_mean"}).has_value());
  // A tensor missing on a replica, or one it has in addition, or a different shape.
  const tensors missing(a.begin(), a.begin() + 1), reshaped = {{"fc/w", tensor::from({1, 2}, std::vector<float>{0.5f, 1.0f})}};
  CHECK(replica_divergence("fc", {{"a1", &a}, {"a2", &missing}}).value_or("").find("differ in fc/w.m") != std::string::npos);
  CHECK(replica_divergence("fc", {{"a1", &missing}, {"a2", &a}}).value_or("").find("differ in fc/w.m") != std::string::npos);
  CHECK(tensor_hash(reshaped[0].second) != tensor_hash(a[0].second));
}
