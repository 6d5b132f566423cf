// Receiving side of the frame channel: accept thread, one reader thread per connection.
#include <sys/mman.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "net/frame_channel.hpp"

namespace fusion::net {

namespace {

constexpr size_t hugepage_bytes = size_t{2} << 20;
constexpr size_t hugepage_min_payload = size_t{4} << 20;
constexpr size_t discard_chunk = size_t{256} << 10;

// Fresh multi-MiB allocations are mmap'd and untouched; asking for transparent huge pages on
// the 2 MiB-aligned interior makes the kernel fault them in 512x fewer steps while recv()
// copies into them. The advice changes no contents and is ignored where THP is off.
void advise_hugepages(std::byte* data, uint64_t n) {
  auto begin = (reinterpret_cast<uintptr_t>(data) + hugepage_bytes - 1) & ~(hugepage_bytes - 1);
  auto end = (reinterpret_cast<uintptr_t>(data) + n) & ~(hugepage_bytes - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

void complete(receive_done& done, const status& received) {
  try {
    if (done) done(received);
  } catch (const std::exception&) {
    // A throwing user callback must not take the reader thread (and the process) down.
  }
}

}  // namespace

const char* to_string(channel_error_kind k) {
  switch (k) {
    case channel_error_kind::refused: return "refused";
    case channel_error_kind::bad_preamble: return "bad preamble";
    case channel_error_kind::truncated: return "truncated";
    case channel_error_kind::io_error: return "i/o error";
  }
  return "?";
}

result<std::unique_ptr<frame_server>> frame_server::start(frame_server_options options, frame_handler on_frame,
                                                          error_handler on_error) {
  if (!on_frame) return fail("frame_server needs a frame handler");
  socket listener;
  if (options.listen) {
    auto bound = listen_tcp(options.host, options.port, options.backlog);
    if (!bound) return fail(bound.error());
    listener = std::move(*bound);
  }
  return std::unique_ptr<frame_server>(
      new frame_server(std::move(options), std::move(listener), std::move(on_frame), std::move(on_error)));
}

frame_server::frame_server(frame_server_options options, socket listener, frame_handler on_frame,
                           error_handler on_error)
    : options_(std::move(options)),
      listener_(std::move(listener)),
      on_frame_(std::move(on_frame)),
      on_error_(std::move(on_error)) {
  if (listener_.valid()) {
    port_ = listener_.local_port();
    acceptor_ = std::thread([this] { accept_loop(); });
  }
}

status frame_server::adopt(socket sock, stream io, std::string peer) {
  reap_finished();
  std::lock_guard lock(mutex_);
  if (stopping_.load()) return fail("the frame server is stopping");
  if (connections_.size() >= options_.max_connections)
    return fail(std::to_string(connections_.size()) + " connections are open, the most this data channel takes");
  auto c = std::make_unique<connection>();
  c->id = next_id_++;
  c->peer = std::move(peer);
  c->sock = std::move(sock);
  c->io = std::move(io);
  c->adopted = true;
  auto* raw = c.get();
  connections_.push_back(std::move(c));
  ++adopted_;
  raw->thread = std::thread([this, raw] { read_loop(*raw); });
  return {};
}

frame_server::~frame_server() { stop(); }

void frame_server::stop() {
  std::lock_guard stop_lock(stop_mutex_);  // concurrent stop() calls wait for the first
  stopping_.store(true);
  // On Linux, shutdown() of a listening socket makes a blocked accept() return EINVAL.
  listener_.shutdown();
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<connection>> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(connections_);
    for (auto& c : all) c->sock.shutdown();
  }
  for (auto& c : all)
    if (c->thread.joinable()) c->thread.join();
  listener_.close();
}

frame_server_stats frame_server::stats() const {
  frame_server_stats s;
  s.frames = frames_.load();
  s.bytes = bytes_.load();
  s.rejected = rejected_.load();
  s.broken_connections = broken_.load();
  s.connections = accepted_.load();
  s.turned_away = turned_away_.load();
  s.tls_refused = tls_refused_.load();
  s.reversed = reversed_.load();
  s.adopted = adopted_.load();
  s.probe_frames = probe_frames_.load();
  s.probe_bytes = probe_bytes_.load();
  return s;
}

void frame_server::accept_loop() {
  while (!stopping_.load()) {
    auto sock = accept_tcp(listener_);
    if (!sock) break;  // listener shut down (stop) or unusable
    if (options_.socket_buffer_bytes > 0) (void)set_buffer_sizes(sock->fd(), options_.socket_buffer_bytes);
    reap_finished();
    std::lock_guard lock(mutex_);
    if (stopping_.load()) break;  // stop() already took the list; drop this late arrival
    auto c = std::make_unique<connection>();
    c->id = next_id_++;
    c->peer = sock->peer_name();
    if (connections_.size() >= options_.max_connections) {
      ++turned_away_;
      report(channel_error_kind::refused, *c,
             "connection from " + c->peer + " refused: " + std::to_string(connections_.size()) +
                 " connections are open, the most this data channel accepts");
      continue;  // `sock` closes here
    }
    c->sock = std::move(*sock);
    auto* raw = c.get();
    connections_.push_back(std::move(c));
    ++accepted_;
    raw->thread = std::thread([this, raw] { read_loop(*raw); });
  }
}

void frame_server::reap_finished() {
  std::list<std::unique_ptr<connection>> done;
  {
    std::lock_guard lock(mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->finished.load()) {
        done.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done)
    if (c->thread.joinable()) c->thread.join();
}

void frame_server::report(channel_error_kind kind, const connection& c, std::string message, bool established) {
  if (!on_error_) return;
  try {
    on_error_(channel_error{kind, c.id, c.peer, std::move(message), established});
  } catch (const std::exception&) {
  }
}

// TLS handshake of an accepted connection; false (reported) when refused.
bool frame_server::secure(connection& c, std::chrono::steady_clock::time_point deadline) {
  if (!options_.tls) {
    c.io = stream(c.sock.fd());
    return true;
  }
  auto secured = tls_accept(c.sock.fd(), *options_.tls, options_.peer, deadline, c.peer);
  if (!secured) {
    if (!stopping_.load()) {
      ++tls_refused_;
      report(channel_error_kind::refused, c, secured.error());
    }
    return false;
  }
  c.io = std::move(*secured);
  return true;
}

// A reverse hello as the first frame: checked by the owner's accept_reverse, acknowledged with
// an ack frame (count 0), then the socket and its stream leave the server for adopt_reverse.
// True when handed over; false (reported) when refused, and the caller closes the connection.
bool frame_server::hand_over(connection& c, const std::string& meta) {
  const std::string from = "reverse hello from " + c.peer;
  auto refuse = [&](const std::string& why) {
    ++rejected_;
    if (!stopping_.load()) ++broken_, report(channel_error_kind::refused, c, from + " refused: " + why);
    return false;
  };
  if (!options_.accept_reverse || !options_.adopt_reverse) return refuse("this data channel takes no reversed connections");
  auto decoded = decode_reverse_hello(meta);
  if (!decoded) return refuse(decoded.error());
  reverse_hello hello{c.id, c.peer, std::move(*decoded), {}};
  if (c.io.secure()) {
    auto holder = peer_certificate_name(c.io);
    if (!holder) return refuse(holder.error());
    hello.certificate_name = std::move(*holder);
  }
  status verdict;
  try {
    verdict = options_.accept_reverse(hello);
  } catch (const std::exception& e) {
    verdict = fail(std::string("the check threw: ") + e.what());
  }
  if (!verdict) return refuse(verdict.error());
  std::byte ack[preamble_size + 8] = {};
  encode_preamble({flag_ack, 8, 0}, ack);
  if (auto st = c.io.write_all(ack, sizeof(ack)); !st) return refuse("cannot acknowledge it: " + st.error());
  socket sock;
  {
    // stop() shuts down every listed socket under this lock: take ours out under it too.
    std::lock_guard lock(mutex_);
    if (stopping_.load()) return false;
    sock = std::move(c.sock);
  }
  ++reversed_;
  try {
    options_.adopt_reverse(hello, std::move(sock), std::move(c.io));
  } catch (const std::exception&) {
    // The callee owned the connection already; its failure is its own to report.
  }
  c.finished.store(true);
  return true;
}

bool frame_server::discard(connection& c, uint64_t n) {
  std::vector<std::byte> scratch(static_cast<size_t>(std::min<uint64_t>(n, discard_chunk)));
  while (n > 0) {
    auto chunk = static_cast<size_t>(std::min<uint64_t>(n, scratch.size()));
    if (!c.io.read_all(scratch.data(), chunk)) return false;
    n -= chunk;
  }
  return true;
}

void frame_server::read_loop(connection& c) {
  const std::string from = "frame channel connection from " + c.peer;
  uint64_t received = 0;  // payload bytes read on this connection (echoed in acks)
  bool established = false;  // a frame arrived whole (see channel_error::established)
  auto broken = [&](channel_error_kind kind, const std::string& why) {
    if (stopping_.load()) return;  // our own shutdown, not the peer's fault
    ++broken_;
    report(kind, c, from + ": " + why, established);
  };
  (void)set_keepalive(c.sock.fd(), options_.keepalive);
  // Until its first preamble and meta, a connection reads against a deadline: a peer that
  // connects and sends nothing (or a byte now and then) is closed instead of holding its thread.
  const bool deadline_on = options_.first_frame_timeout.count() > 0;
  const auto deadline = std::chrono::steady_clock::now() + options_.first_frame_timeout;
  // A handshake always has a deadline: TLS needs several reads, each of which could wait.
  if (!c.adopted && !secure(c, deadline_on ? deadline : std::chrono::steady_clock::now() + std::chrono::seconds(10))) {
    c.sock.shutdown();
    c.finished.store(true);
    return;
  }
  // A connection this side opened was greeted by the far side's welcome (or ack of its reverse
  // hello) already; its first frame may come whenever the run first sends a tensor.
  bool greeted = c.adopted;  // a whole preamble and meta arrived: the peer speaks the protocol
  auto read = [&](void* data, size_t n, size_t* got) {
    return greeted || !deadline_on ? c.io.read_all(data, n, got) : c.io.read_all_by(data, n, deadline, got);
  };
  const std::string silent = "sent no frame within " + std::to_string(options_.first_frame_timeout.count()) +
                             " ms of connecting, closing the connection";
  for (;;) {
    std::byte raw[preamble_size];
    size_t got = 0;
    if (auto st = read(raw, preamble_size, &got); !st) {
      // EOF exactly between frames is the normal way for a sender to leave.
      if (st.error() == deadline_passed)
        broken(channel_error_kind::io_error, silent);
      else if (got != 0 || st.error() != closed_by_peer)
        broken(got ? channel_error_kind::truncated : channel_error_kind::io_error,
               "closed inside a frame preamble after " + std::to_string(got) + " of " +
                   std::to_string(preamble_size) + " bytes (" + st.error() + ")");
      break;
    }
    auto pre = decode_preamble(raw, options_.max_meta, options_.max_payload);
    if (pre && (pre->flags & flag_ack)) pre = fail("an ack frame was sent to the server");
    if (!pre) {
      // The stream cannot be resynchronised after a bad preamble: drop the connection.
      ++rejected_;
      broken(channel_error_kind::bad_preamble, "bad frame preamble, closing the connection: " + pre.error());
      break;
    }
    incoming_frame frame;
    frame.connection_id = c.id;
    frame.peer = c.peer;
    frame.payload_size = pre->payload_size;
    frame.meta.resize(pre->meta_size);
    if (auto st = read(frame.meta.data(), frame.meta.size(), nullptr); !st) {
      broken(channel_error_kind::truncated,
             st.error() == deadline_passed ? silent : "closed inside the meta of a frame (" + st.error() + ")");
      break;
    }
    if (pre->flags & flag_reverse) {
      if (greeted) {
        ++rejected_;
        broken(channel_error_kind::bad_preamble,
               "a reverse hello after the first frame of a connection, closing the connection");
        break;
      }
      if (hand_over(c, frame.meta)) return;  // the connection is someone else's now
      break;
    }
    greeted = true;
    bool ok = true;
    if (pre->flags & flag_probe) {
      ok = discard(c, pre->payload_size);
      // An empty probe is a frame_sender's greeting, not a delivery: a connection that sent only
      // that stays a stranger's when its next frame is refused.
      if (ok) ++probe_frames_, probe_bytes_ += pre->payload_size, established |= pre->payload_size > 0;
    } else {
      frame_target target;
      try {
        target = on_frame_(frame);
      } catch (const std::exception& e) {
        target = frame_target::refuse(std::string("frame handler threw: ") + e.what());
      }
      if (!target.refused && !target.skipped && target.data == nullptr && pre->payload_size > 0)
        target = frame_target::refuse("frame handler gave no destination for " +
                                      std::to_string(pre->payload_size) + " payload bytes");
      if (target.refused) {
        ++rejected_;
        report(channel_error_kind::refused, c,
               "frame from " + c.peer + " (" + std::to_string(pre->payload_size) + " payload bytes) refused: " +
                   target.refusal,
               established);
        ok = discard(c, pre->payload_size);
      } else if (target.skipped) {
        ok = discard(c, pre->payload_size);
        established |= ok;
      } else {
        if (options_.hugepage_advice && pre->payload_size >= hugepage_min_payload)
          advise_hugepages(target.data, pre->payload_size);
        size_t payload_got = 0;
        auto st = c.io.read_all(target.data, static_cast<size_t>(pre->payload_size), &payload_got);
        if (!st) {
          std::string why = "closed mid-frame after " + std::to_string(payload_got) + " of " +
                            std::to_string(pre->payload_size) + " payload bytes (" + st.error() + ")";
          complete(target.done, fail(stopping_.load() ? "frame server stopped during the transfer" : from + ": " + why));
          broken(channel_error_kind::truncated, why);
          break;
        }
        ++frames_;
        bytes_ += pre->payload_size;
        established = true;
        complete(target.done, status{});
      }
    }
    if (!ok) {
      broken(channel_error_kind::truncated, "closed while a discarded payload was being read");
      break;
    }
    received += pre->payload_size;
    if (pre->flags & flag_ack_request) {
      // Only this thread writes to the socket, so the ack needs no lock.
      std::byte ack[preamble_size + 8];
      encode_preamble({flag_ack, 8, 0}, ack);
      for (size_t i = 0; i < 8; ++i) ack[preamble_size + i] = static_cast<std::byte>((received >> (8 * i)) & 0xff);
      if (auto st = c.io.write_all(ack, sizeof(ack)); !st) {
        broken(channel_error_kind::io_error, "cannot send ack: " + st.error());
        break;
      }
    }
  }
  // shutdown, not close: the peer sees the end now, while the descriptor number stays ours
  // until the connection is reaped (stop() may still call shutdown on it concurrently).
  c.sock.shutdown();
  if (options_.on_closed) options_.on_closed(c.id);
  c.finished.store(true);
}

}  // namespace fusion::net
