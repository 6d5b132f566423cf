// fusion-bench-transfer: one-way tensor transfer between two processes on loopback.
//
// For each size, the median over N rounds of the time from the start of the send until an
// 8-byte ack from the receiver arrives, for:
//   raw      plain blocking socket: send the buffer, recv into a preallocated buffer (reference)
//   frame    net::frame_sender -> net::frame_server into a freshly allocated fusion::tensor
//            (the real receive path; THP advice on, the server's default)
//   frame, no THP advice / frame, reused buffer   diagnostics that split the gap of "frame"
//   frame over TLS   "frame" through TLS 1.3 (AES-128-GCM) with node certificates of a cluster CA
//            made for the run; the summary line gives its ratio to plaintext "frame"
//   caf      CAF middleman, request(tensor) -> uint64 ack, raw-bytes inspect of actors/messages.hpp
// Each receiver is a forked child (forked before any thread exists here); rounds interleave the
// paths so that drift of this noisy VM hits every path alike.
//
//   fusion-bench-transfer [--rounds-4 N] [--rounds-64 N] [--no-caf] [--no-tls] [--only PATH-SUBSTRING]
//                         [--sockbuf BYTES]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "tensor/tensor.hpp"
#include "net/frame_channel.hpp"
#include "security/certs.hpp"

using namespace fusion;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr size_t max_size = size_t{64} << 20;
int sockbuf = 0;  // --sockbuf: fixed SO_SNDBUF/SO_RCVBUF for the frame paths (0 = autotuning)
std::string certs;  // a cluster CA with nodes "rx" and "tx", made before the children fork

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "fusion-bench-transfer: %s\n", why.c_str());
  std::_Exit(1);
}

void write_ports(int fd, std::vector<uint16_t> ports) {
  if (write(fd, ports.data(), ports.size() * sizeof(uint16_t)) < 0) die("pipe write failed");
  close(fd);
}

// Child: raw TCP receiver. Message = u64 length + bytes; answers an 8-byte ack.
[[noreturn]] void raw_child(int pipe_fd) {
  auto l = net::listen_tcp("127.0.0.1", 0);
  if (!l) die(l.error());
  write_ports(pipe_fd, {l->local_port()});
  auto s = net::accept_tcp(*l);
  if (!s) die(s.error());
  std::vector<char> buf(max_size, 1);  // allocated and touched once, like a reused buffer
  for (;;) {
    uint64_t n = 0;
    if (!net::recv_all(s->fd(), &n, 8) || n > max_size || !net::recv_all(s->fd(), buf.data(), n)) std::_Exit(0);
    (void)net::send_all(s->fd(), &n, 8);
  }
}

std::shared_ptr<const net::tls_context> tls_of(const std::string& node) {
  auto ctx = net::tls_context::load(security::files_in(certs, security::role::node, node));
  if (!ctx) die(ctx.error());
  return *ctx;
}

// Child: three frame_servers (THP advice on / off, TLS) and an ack socket. meta "fresh" receives into a
// new tensor (shape from the payload size, as a real header would give), "reuse" into one buffer.
[[noreturn]] void frame_child(int pipe_fd) {
  auto ack_l = net::listen_tcp("127.0.0.1", 0);
  if (!ack_l) die(ack_l.error());
  std::vector<std::byte> reused(max_size, std::byte{1});
  int ack_fd = -1;
  auto handler = [&](net::incoming_frame& f) -> net::frame_target {
    auto n = f.payload_size;
    if (f.meta == "reuse")
      return net::frame_target::into(reused.data(), [&, n](const status&) { (void)net::send_all(ack_fd, &n, 8); });
    auto t = std::make_shared<tensor>(tensor::uninitialized({static_cast<int64_t>(n / 4)}));
    return net::frame_target::into(t->bytes(), [&, t, n](const status&) { (void)net::send_all(ack_fd, &n, 8); });
  };
  net::frame_server_options on, off;
  off.hugepage_advice = false;
  on.socket_buffer_bytes = off.socket_buffer_bytes = sockbuf;
  auto secure = on;
  secure.tls = tls_of("rx");
  secure.peer = {security::role::node, "tx"};
  auto s1 = net::frame_server::start(on, handler);
  auto s2 = net::frame_server::start(off, handler);
  auto s3 = net::frame_server::start(secure, handler);
  if (!s1 || !s2 || !s3) die(!s1 ? s1.error() : !s2 ? s2.error() : s3.error());
  write_ports(pipe_fd, {ack_l->local_port(), (*s1)->port(), (*s2)->port(), (*s3)->port()});
  auto ack = net::accept_tcp(*ack_l);
  if (!ack) die(ack.error());
  ack_fd = ack->fd();
  char c;
  (void)net::recv_all(ack_fd, &c, 1);  // the parent closing the ack socket ends the child
  std::_Exit(0);
}

// Child: CAF actor answering a tensor with its byte count.
[[noreturn]] void caf_child(int pipe_fd) {
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto sink = sys.spawn([]() -> caf::behavior {
    return {[](tensor& t) -> uint64_t { return t.nbytes(); }};
  });
  auto port = sys.middleman().publish(sink, 0, "127.0.0.1", true);
  if (!port) die(sys.render(port.error()));
  write_ports(pipe_fd, {*port});
  pause();  // killed by the parent
  std::_Exit(0);
}

pid_t spawn_child(void (*body)(int), std::vector<uint16_t>& ports, size_t nports) {
  int fds[2];
  if (pipe(fds) < 0) die("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    body(fds[1]);
  }
  close(fds[1]);
  ports.resize(nports);
  size_t want = nports * sizeof(uint16_t), got = 0;
  while (got < want) {
    ssize_t r = read(fds[0], reinterpret_cast<char*>(ports.data()) + got, want - got);
    if (r <= 0) die("child did not report its ports");
    got += static_cast<size_t>(r);
  }
  close(fds[0]);
  return pid;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds4 = 10, rounds64 = 5;
  bool with_caf = true, with_tls = true;
  std::string only;  // run raw TCP plus the paths whose name contains this (profiling)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds-4" && i + 1 < argc) rounds4 = std::max(1, std::atoi(argv[++i]));
    else if (a == "--rounds-64" && i + 1 < argc) rounds64 = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-caf") with_caf = false;
    else if (a == "--no-tls") with_tls = false;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--sockbuf" && i + 1 < argc) sockbuf = std::atoi(argv[++i]);
    else die("usage: fusion-bench-transfer [--rounds-4 N] [--rounds-64 N] [--no-caf] [--no-tls] [--only PATH-SUBSTRING] "
             "[--sockbuf BYTES]");
  }
  certs = (std::filesystem::temp_directory_path() / ("fusion-bench-transfer-" + std::to_string(getpid()))).string();
  security::make_cluster_certs(certs, {"rx", "tx"});
  // Fork every receiver before this process starts any thread.
  std::vector<uint16_t> raw_ports, frame_ports, caf_ports;
  std::vector<pid_t> children;
  children.push_back(spawn_child(raw_child, raw_ports, 1));
  children.push_back(spawn_child(frame_child, frame_ports, 4));
  if (with_caf) children.push_back(spawn_child(caf_child, caf_ports, 1));

  auto raw = net::connect_tcp("127.0.0.1", raw_ports[0]);
  auto ack = net::connect_tcp("127.0.0.1", frame_ports[0]);
  net::frame_sender_options txo;
  txo.socket_buffer_bytes = sockbuf;
  auto tx_thp = net::frame_sender::connect("127.0.0.1", frame_ports[1], txo);
  auto tx_nothp = net::frame_sender::connect("127.0.0.1", frame_ports[2], txo);
  if (!raw || !ack || !tx_thp || !tx_nothp) die("cannot connect to a receiver");
  auto tlso = txo;
  tlso.tls = tls_of("tx");
  tlso.peer = {security::role::node, "rx"};
  auto tx_tls = net::frame_sender::connect("127.0.0.1", frame_ports[3], tlso);
  if (!tx_tls) die(tx_tls.error());

  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  caf::actor remote;
  if (with_caf) {
    auto r = sys.middleman().remote_actor("127.0.0.1", caf_ports[0]);
    if (!r) die(sys.render(r.error()));
    remote = *r;
  }
  caf::scoped_actor self{sys};

  const std::vector<std::string> paths = {"raw TCP", "frame -> fresh tensor", "frame over TLS -> fresh tensor",
                                          "frame, no THP advice", "frame -> reused buffer", "CAF middleman"};
  std::map<std::pair<size_t, std::string>, std::vector<double>> times;
  for (size_t size : {size_t{4} << 20, size_t{64} << 20}) {
    auto src = tensor::uninitialized({static_cast<int64_t>(size / 4)});
    for (size_t i = 0; i < size / 4; ++i) src.f32()[i] = static_cast<float>(i % 1000);
    int rounds = size == (size_t{4} << 20) ? rounds4 : rounds64;
    for (int r = -1; r < rounds; ++r) {  // round -1 warms every connection up, not recorded
      for (const auto& path : paths) {
        if (path == "CAF middleman" && !with_caf) continue;
        if (path == "frame over TLS -> fresh tensor" && !with_tls) continue;
        if (!only.empty() && path != "raw TCP" && path.find(only) == std::string::npos) continue;
        tensor copy;
        if (path == "CAF middleman") copy = src;  // an actor sends a moved tensor: copy untimed
        uint64_t got = 0;
        auto t0 = clock_type::now();
        if (path == "raw TCP") {
          uint64_t n = size;
          if (!net::send_all(raw->fd(), &n, 8) || !net::send_all(raw->fd(), src.bytes(), size) ||
              !net::recv_all(raw->fd(), &got, 8))
            die("raw transfer failed");
        } else if (path == "CAF middleman") {
          self->request(remote, caf::infinite, std::move(copy))
              .receive([&](uint64_t n) { got = n; }, [&](caf::error& e) { die(sys.render(e)); });
        } else {
          auto& tx = path == "frame, no THP advice" ? *tx_nothp : path == "frame over TLS -> fresh tensor" ? *tx_tls : *tx_thp;
          tx->send(path == "frame -> reused buffer" ? "reuse" : "fresh", src.bytes(), size, nullptr);
          if (!net::recv_all(ack->fd(), &got, 8)) die("frame ack missing");
        }
        double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        if (got != size) die("receiver acknowledged " + std::to_string(got) + " bytes of " + std::to_string(size));
        if (r >= 0) times[{size, path}].push_back(ms);
      }
    }
  }
  std::printf("| size | path | median ms | min-max ms | MiB/s | ratio to raw TCP |\n|---|---|---:|---:|---:|---:|\n");
  for (size_t size : {size_t{4} << 20, size_t{64} << 20}) {
    double raw_ms = median(times[{size, "raw TCP"}]);
    for (const auto& path : paths) {
      auto it = times.find({size, path});
      if (it == times.end()) continue;
      double ms = median(it->second);
      auto [lo, hi] = std::minmax_element(it->second.begin(), it->second.end());
      std::printf("| %zu MiB | %s | %.2f | %.2f-%.2f | %.0f | %.2f |\n", size >> 20, path.c_str(), ms, *lo, *hi,
                  (size / 1048576.0) / (ms / 1000), raw_ms / ms);
    }
  }
  for (size_t size : {size_t{4} << 20, size_t{64} << 20}) {
    auto plain = times.find({size, "frame -> fresh tensor"}), secure = times.find({size, "frame over TLS -> fresh tensor"});
    if (plain != times.end() && secure != times.end())
      std::printf("\nTLS / plaintext frame channel at %zu MiB: %.2f\n", size >> 20, median(plain->second) / median(secure->second));
  }
  std::fflush(stdout);
  std::filesystem::remove_all(certs);
  raw->close();
  ack->close();
  (*tx_thp)->close();
  (*tx_nothp)->close();
  (*tx_tls)->close();
  for (pid_t pid : children) {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
  self->send_exit(self, caf::exit_reason::user_shutdown);
  return 0;
}
