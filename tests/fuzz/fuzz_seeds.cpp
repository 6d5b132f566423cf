// Writes the binary seed corpora of the fuzz targets with the project's own encoders, so the
// seeds are real checkpoints, wire chunks, frame preambles and codec payloads:
//
//     fuzz_seeds DIR    -> DIR/checkpoint, DIR/wire, DIR/preamble, DIR/codec
//
// scripts/fuzz.sh runs it into its temporary working corpus; tests/fuzz/corpus/<target>/ keeps
// only the text seeds and the reproducers of fixed bugs.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compression/quant.hpp"
#include "compression/topk.hpp"
#include "core/checkpoint.hpp"
#include "core/wire.hpp"
#include "net/frame_channel.hpp"

namespace {

std::string out_dir;

void write(const std::string& target, const std::string& name, const void* data, size_t n) {
  const std::string dir = out_dir + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
  if (!f || (n && std::fwrite(data, 1, n, f) != n) || std::fclose(f) != 0) {
    std::perror((dir + "/" + name).c_str());
    std::exit(1);
  }
}

std::vector<float> ramp(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(0.7f * static_cast<float>(i)) * static_cast<float>(i % 5);
  return x;
}

void checkpoints() {
  using fusion::tensor;
  ::mkdir((out_dir + "/checkpoint").c_str(), 0755);
  fusion::checkpoint c;
  c.step = 42;
  c.model_name = "gpt-char-tiny";
  c.meta = "[train]\nsteps=42\n";
  auto x = ramp(6);
  c.tensors.emplace_back("wte.weight", tensor::from({2, 3}, x));
  int32_t ids[] = {1, 2, 3};
  c.tensors.emplace_back("tokens", tensor::from_i32({3}, ids));
  tensor scalar({}, fusion::dtype::f64);
  scalar.f64()[0] = 0.5;
  c.tensors.emplace_back("adam.t", std::move(scalar));
  c.tensors.emplace_back("empty", tensor({0, 4}));
  fusion::save_checkpoint(out_dir + "/checkpoint/small.ckpt", c);
  fusion::save_checkpoint(out_dir + "/checkpoint/bare.ckpt", fusion::checkpoint{});
}

// One wire_fuzz record per chunk: u16 header length, header, u16 payload length, payload.
void add_record(std::string& out, const fusion::wire_header& h, const void* payload) {
  auto header = fusion::encode_wire_header(h);
  auto u16 = [&](size_t v) {
    out += static_cast<char>(v & 0xff);
    out += static_cast<char>(v >> 8);
  };
  u16(header.size());
  out += header;
  u16(h.chunk_bytes);
  out.append(static_cast<const char*>(payload) + h.offset, h.chunk_bytes);
}

void wires() {
  auto x = ramp(40);
  fusion::wire_header raw;
  raw.edge = 3;
  raw.step = 7;
  raw.micro_batch = 1;
  raw.shape = {4, 10};
  raw.total_bytes = 160;
  raw.payload_bytes = 160;
  for (uint64_t limit : {160, 64}) {
    std::string rec;
    for (auto& h : fusion::split_into_chunks(raw, limit)) add_record(rec, h, x.data());
    write("wire", "raw-" + std::to_string(limit), rec.data(), rec.size());
  }
  std::vector<std::byte> payload;
  fusion::encode_topk(x, 0.25, fusion::value_type::f16, 16, payload);
  fusion::wire_header topk = raw;
  topk.dir = fusion::wire_direction::backward;
  topk.encoding = fusion::codec_kind::topk;
  topk.payload_bytes = payload.size();
  std::string rec;
  for (auto& h : fusion::split_into_chunks(topk, 24)) add_record(rec, h, payload.data());
  write("wire", "topk", rec.data(), rec.size());
}

void codecs() {
  auto x = ramp(100);
  const fusion::value_type types[] = {fusion::value_type::f32, fusion::value_type::f16, fusion::value_type::bf16,
                                      fusion::value_type::int8};
  for (auto vt : types)
    for (double ratio : {0.05, 0.5}) {  // u16 indices, and a bitmap
      std::vector<std::byte> payload;
      fusion::encode_topk(x, ratio, vt, 32, payload);
      std::string s(1, '\0');  // mode 0: decode into the size the payload announces
      s.append(reinterpret_cast<const char*>(payload.data()), payload.size());
      write("codec", "topk-" + fusion::to_string(vt) + "-" + std::to_string(static_cast<int>(ratio * 100)), s.data(),
            s.size());
    }
  std::string enc(1, '\x95');  // mode >= 0x80: encode these floats, then decode
  enc.append(reinterpret_cast<const char*>(x.data()), 64 * sizeof(float));
  write("codec", "round-trip", enc.data(), enc.size());
  for (unsigned bits : {8u, 4u})
    for (uint32_t block : {7u, 64u}) {  // int4 bytes across blocks, and whole ones
      std::vector<std::byte> payload;
      fusion::encode_quant(std::span<const float>(x.data(), 99), bits, block, payload);  // odd n
      std::string s(1, '\0');
      s.append(reinterpret_cast<const char*>(payload.data()), payload.size());
      write("codec", "int" + std::to_string(bits) + "-" + std::to_string(block), s.data(), s.size());
    }
  for (const char m : {'\xa3', '\xc7'}) {  // round trips through int8 and int4
    std::string q(1, m);
    q.append(reinterpret_cast<const char*>(x.data()), 63 * sizeof(float));
    write("codec", std::string("round-trip-") + (m == '\xa3' ? "int8" : "int4"), q.data(), q.size());
  }
}

void preambles() {
  namespace fn = fusion::net;
  std::string stream(1, '\0');  // mode byte: default limits
  auto frame = [&](uint8_t flags, const std::string& meta, size_t payload) {
    std::byte pre[fn::preamble_size];
    fn::encode_preamble({flags, static_cast<uint32_t>(meta.size()), payload}, pre);
    stream.append(reinterpret_cast<const char*>(pre), sizeof pre);
    stream += meta;
    stream.append(payload, '\x5a');
  };
  frame(fn::flag_ack_request, "header", 16);
  frame(fn::flag_probe, "", 32);
  frame(fn::flag_ack, std::string("\x30\0\0\0\0\0\0\0", 8), 0);
  write("preamble", "stream", stream.data(), stream.size());
  // A connection that starts with a reverse hello (connection reversal), then a frame.
  stream.assign(1, '\0');
  frame(fn::flag_reverse, fn::encode_reverse_hello({"b1", "0f3a9c"}), 0);
  frame(0, "header", 8);
  write("preamble", "reverse", stream.data(), stream.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  out_dir = argv[1];
  ::mkdir(out_dir.c_str(), 0755);
  checkpoints();
  wires();
  codecs();
  preambles();
  return 0;
}
