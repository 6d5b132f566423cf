// Preamble encoding and the sending side of the frame channel (frame_server.cpp has the rest).
#include "net/frame_channel.hpp"

#include <sys/uio.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <exception>
#include <vector>

namespace fusion::net {

namespace {

template <class T>
void put_le(std::byte* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

template <class T>
T get_le(const std::byte* in) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(std::to_integer<uint8_t>(in[i])) << (8 * i);
  return v;
}

// A writer may batch this many small frames into one sendmsg; 3 iovecs each stays below IOV_MAX.
constexpr size_t max_batch = 64;
// TLS records are 16 KiB: the writer gathers this many bytes of them per system call.
constexpr size_t send_buffer_bytes = size_t{512} << 10;

}  // namespace

void encode_preamble(const preamble& p, std::byte* out) {
  put_le<uint32_t>(out, frame_magic);
  out[4] = static_cast<std::byte>(frame_version);
  out[5] = static_cast<std::byte>(p.flags);
  put_le<uint16_t>(out + 6, 0);
  put_le<uint32_t>(out + 8, p.meta_size);
  put_le<uint64_t>(out + 12, p.payload_size);
}

result<preamble> decode_preamble(const std::byte* in, uint32_t max_meta, uint64_t max_payload) {
  auto magic = get_le<uint32_t>(in);
  if (magic != frame_magic) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", magic);
    return fail(std::string("bad magic ") + buf + " (expected 0x4b4e4c46 \"FLNK\"; not a FusionLLM data channel?)");
  }
  auto version = std::to_integer<uint8_t>(in[4]);
  if (version != frame_version)
    return fail("unsupported channel protocol version " + std::to_string(version) + " (this build speaks " +
                std::to_string(frame_version) + ")");
  preamble p;
  p.flags = std::to_integer<uint8_t>(in[5]);
  if (p.flags & ~known_flags) return fail("unknown preamble flags " + std::to_string(p.flags));
  if (get_le<uint16_t>(in + 6) != 0) return fail("reserved preamble bytes are not zero");
  p.meta_size = get_le<uint32_t>(in + 8);
  p.payload_size = get_le<uint64_t>(in + 12);
  if (p.meta_size > max_meta)
    return fail("meta length " + std::to_string(p.meta_size) + " exceeds the limit of " + std::to_string(max_meta));
  if (p.payload_size > max_payload)
    return fail("payload length " + std::to_string(p.payload_size) + " exceeds the limit of " +
                std::to_string(max_payload));
  if (p.flags & flag_reverse) {
    if (p.flags != flag_reverse) return fail("a reverse hello with other flags (" + std::to_string(p.flags) + ")");
    if (p.payload_size != 0)
      return fail("a reverse hello with a payload of " + std::to_string(p.payload_size) + " bytes (it has none)");
    if (p.meta_size > max_reverse_meta)
      return fail("a reverse hello with " + std::to_string(p.meta_size) + " bytes of meta (at most " +
                  std::to_string(max_reverse_meta) + ")");
  }
  return p;
}

std::string encode_reverse_hello(const reverse_hello_meta& m) {
  std::string out;
  out.push_back(static_cast<char>(static_cast<uint8_t>(std::min<size_t>(m.node.size(), 255))));
  out.append(m.node, 0, 255);
  out.push_back(static_cast<char>(static_cast<uint8_t>(std::min<size_t>(m.token.size(), 255))));
  out.append(m.token, 0, 255);
  return out;
}

result<reverse_hello_meta> decode_reverse_hello(std::string_view meta) {
  reverse_hello_meta m;
  size_t at = 0;
  for (auto* field : {&m.node, &m.token}) {
    const char* what = field == &m.node ? "node name" : "token";
    if (at >= meta.size()) return fail(std::string("reverse hello ends before its ") + what);
    size_t n = static_cast<uint8_t>(meta[at++]);
    if (n == 0) return fail(std::string("reverse hello with an empty ") + what);
    if (meta.size() - at < n)
      return fail(std::string("reverse hello: its ") + what + " of " + std::to_string(n) + " bytes is cut off after " +
                  std::to_string(meta.size() - at));
    *field = std::string(meta.substr(at, n));
    at += n;
  }
  if (at != meta.size())
    return fail("reverse hello with " + std::to_string(meta.size() - at) + " stray bytes after its token");
  return m;
}

const char* to_string(send_status s) {
  switch (s) {
    case send_status::queued: return "queued";
    case send_status::queue_full: return "queue full";
    case send_status::closed: return "sender closed";
    case send_status::too_large: return "frame too large";
  }
  return "?";
}

result<std::unique_ptr<frame_sender>> frame_sender::connect(const std::string& host, uint16_t port,
                                                            frame_sender_options options) {
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  auto sock = connect_tcp(host, port, options.connect_timeout);
  if (!sock) return fail(sock.error());
  if (options.socket_buffer_bytes > 0) (void)set_buffer_sizes(sock->fd(), options.socket_buffer_bytes);
  auto peer = endpoint_name(host, port);
  stream io(sock->fd());
  if (options.tls) {
    auto secured = tls_connect(sock->fd(), *options.tls, options.peer, deadline, peer);
    if (!secured) return fail(secured.error());
    io = std::move(*secured);
    io.buffer_writes(send_buffer_bytes);
  }
  std::unique_ptr<frame_sender> sender(new frame_sender(std::move(*sock), std::move(io), std::move(peer), options));
  sender->greet();
  return sender;
}

result<reversed_connection> dial_reverse(const std::string& host, uint16_t port, const reverse_hello_meta& hello,
                                         reverse_options options) {
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  const auto peer = endpoint_name(host, port);
  const std::string where = "reverse connection to " + peer + ": ";
  auto sock = connect_tcp(host, port, options.connect_timeout);
  if (!sock) return fail(where + sock.error());
  if (options.socket_buffer_bytes > 0) (void)set_buffer_sizes(sock->fd(), options.socket_buffer_bytes);
  stream io(sock->fd());
  if (options.tls) {
    auto secured = tls_connect(sock->fd(), *options.tls, options.peer, deadline, peer);
    if (!secured) return fail(where + secured.error());
    io = std::move(*secured);
  }
  const std::string meta = encode_reverse_hello(hello);
  std::string frame(preamble_size, '\0');
  encode_preamble({flag_reverse, static_cast<uint32_t>(meta.size()), 0}, reinterpret_cast<std::byte*>(frame.data()));
  frame += meta;
  if (auto st = io.write_all(frame.data(), frame.size()); !st) return fail(where + "cannot send the hello: " + st.error());
  std::byte ack[preamble_size + 8];
  if (auto st = io.read_all_by(ack, sizeof(ack), deadline); !st)
    return fail(where + (st.error() == deadline_passed ? "no answer to the reverse hello in time"
                         : st.error() == closed_by_peer ? "the server refused the reverse hello (it closed the connection)"
                                                        : "no answer to the reverse hello: " + st.error()));
  auto pre = decode_preamble(ack, 8, 0);
  if (!pre || pre->flags != flag_ack || pre->meta_size != 8)
    return fail(where + "the server answered the reverse hello with something else than an ack");
  return reversed_connection{std::move(*sock), std::move(io), peer};
}

std::unique_ptr<frame_sender> frame_sender::adopt(socket sock, stream io, std::string peer,
                                                  frame_sender_options options) {
  io.buffer_writes(send_buffer_bytes);
  return std::unique_ptr<frame_sender>(new frame_sender(std::move(sock), std::move(io), std::move(peer), options));
}

frame_sender::frame_sender(socket sock, stream io, std::string peer, frame_sender_options options)
    : socket_(std::move(sock)), stream_(std::move(io)), peer_(std::move(peer)), options_(std::move(options)) {
  if (options_.max_queued_frames == 0) options_.max_queued_frames = 1;
  writer_ = std::thread([this] { writer_loop(); });
}

frame_sender::~frame_sender() { abort(); }

send_status frame_sender::send(std::string meta, const std::byte* data, size_t n,
                               std::shared_ptr<const void> keep_alive, send_done done) {
  return enqueue(std::move(meta), data, n, std::move(keep_alive), std::move(done), true);
}

send_status frame_sender::try_send(std::string meta, const std::byte* data, size_t n,
                                   std::shared_ptr<const void> keep_alive, send_done done) {
  return enqueue(std::move(meta), data, n, std::move(keep_alive), std::move(done), false);
}

send_status frame_sender::enqueue(std::string meta, const std::byte* data, size_t n,
                                  std::shared_ptr<const void> keep_alive, send_done done, bool block) {
  if (meta.size() > max_meta_bytes || n > max_payload_bytes) return send_status::too_large;
  std::unique_lock lock(mutex_);
  auto stopped = [&] { return closing_ || aborted_ || failed_; };
  if (block) space_cv_.wait(lock, [&] { return stopped() || queue_.size() < options_.max_queued_frames; });
  if (stopped()) return send_status::closed;
  if (queue_.size() >= options_.max_queued_frames) return send_status::queue_full;
  item& it = queue_.emplace_back();
  encode_preamble({0, static_cast<uint32_t>(meta.size()), n}, it.preamble);
  it.meta = std::move(meta);
  it.data = data;
  it.size = n;
  it.keep_alive = std::move(keep_alive);
  it.done = std::move(done);
  lock.unlock();
  work_cv_.notify_one();
  return send_status::queued;
}

// The server closes a connection whose first frame has not come within its
// first_frame_timeout (frame_server_options), and a connection may carry nothing for longer:
// a link that only peer-held snapshots use waits snapshot-every steps for its first tensor.
// An empty probe frame, which the server reads and drops, tells it at once that the peer
// speaks the protocol; no reply is asked for.
void frame_sender::greet() {
  {
    std::lock_guard lock(mutex_);
    item& it = queue_.emplace_back();
    encode_preamble({flag_probe, 0, 0}, it.preamble);
    it.data = nullptr;
    it.size = 0;
    it.greeting = true;
  }
  work_cv_.notify_one();
}

void frame_sender::writer_loop() {
  std::deque<item> batch;
  std::vector<iovec> iov;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return !queue_.empty() || closing_ || aborted_; });
      if (aborted_ || queue_.empty()) break;
      // Several small frames go out in one system call; a big payload is one writev anyway.
      while (!queue_.empty() && batch.size() < max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      in_flight_ = batch.size();
    }
    space_cv_.notify_all();
    iov.clear();
    uint64_t payload = 0;
    for (auto& it : batch) {
      iov.push_back({it.preamble, preamble_size});
      iov.push_back({it.meta.data(), it.meta.size()});
      iov.push_back({const_cast<std::byte*>(it.data), it.size});
      payload += it.size;
    }
    auto st = stream_.writev_all(iov.data(), static_cast<int>(iov.size()));
    if (!st) {
      std::string err;
      {
        std::lock_guard lock(mutex_);
        err = aborted_ ? "send to " + peer_ + " aborted" : "send to " + peer_ + " failed: " + st.error();
        if (error_.empty()) error_ = err;
        failed_ = true;
      }
      fail_all(batch, err);
      break;
    }
    for (auto& it : batch) frames_sent_ += it.greeting ? 0 : 1;
    bytes_sent_ += payload;
    for (auto& it : batch) {
      try {
        if (it.done) it.done(status{});
      } catch (const std::exception&) {
        // A throwing completion must not kill the writer; the frame itself was delivered.
      }
    }
    batch.clear();  // releases the keep_alive handles before close() can return
    {
      std::lock_guard lock(mutex_);
      in_flight_ = 0;
    }
    space_cv_.notify_all();
  }
  std::deque<item> rest;
  std::string err;
  {
    std::lock_guard lock(mutex_);
    rest.swap(queue_);
    failed_ = true;  // later send() calls answer closed
    err = error_.empty() ? "send to " + peer_ + " aborted" : error_;
  }
  fail_all(rest, err);
  {
    std::lock_guard lock(mutex_);
    in_flight_ = 0;
  }
  space_cv_.notify_all();
}

void frame_sender::fail_all(std::deque<item>& items, const std::string& error) {
  for (auto& it : items) {
    try {
      if (it.done) it.done(fail(error));
    } catch (const std::exception&) {
    }
  }
  items.clear();
}

void frame_sender::close(std::chrono::milliseconds flush_timeout) {
  bool drained = true;
  {
    std::unique_lock lock(mutex_);
    // After abort() the socket is closed and its number may belong to another connection by
    // now: a close_notify (and the non-blocking flag it sets) would land on that one.
    if (aborted_) return;
    closing_ = true;
    work_cv_.notify_all();
    drained = space_cv_.wait_for(lock, flush_timeout,
                                 [&] { return (queue_.empty() && in_flight_ == 0) || failed_ || aborted_; });
  }
  if (!drained) {
    abort();
    return;
  }
  if (writer_.joinable() && writer_.get_id() != std::this_thread::get_id()) writer_.join();
  if (!writer_.joinable()) stream_.close_notify();  // the writer is gone: the session is ours
  socket_.close();
}

void frame_sender::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    closing_ = true;
  }
  // shutdown (not close) wakes a writer blocked in sendmsg; the number is released after join.
  socket_.shutdown();
  work_cv_.notify_all();
  space_cv_.notify_all();
  if (writer_.joinable() && writer_.get_id() != std::this_thread::get_id()) writer_.join();
  if (!writer_.joinable()) socket_.close();
}

std::string frame_sender::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

size_t frame_sender::pending() const {
  std::lock_guard lock(mutex_);
  return queue_.size() + in_flight_;
}

}  // namespace fusion::net
