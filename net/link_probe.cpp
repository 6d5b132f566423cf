#include "net/link_probe.hpp"

#include <poll.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <vector>

#include "net/frame_channel.hpp"
#include "net/stream.hpp"

namespace fusion::net {

namespace {

using clock = std::chrono::steady_clock;

constexpr size_t ack_size = preamble_size + 8;
constexpr uint64_t min_window = uint64_t{1} << 20;
constexpr uint64_t max_window = uint64_t{64} << 20;

// The server's cumulative payload byte count from one ack frame.
result<uint64_t> decode_ack(const std::byte* buf) {
  auto pre = decode_preamble(buf);
  if (!pre) return fail("bad probe ack: " + pre.error());
  if (pre->flags != flag_ack || pre->meta_size != 8 || pre->payload_size != 0)
    return fail("bad probe ack: unexpected frame layout");
  uint64_t count = 0;
  for (size_t i = 0; i < 8; ++i) count |= static_cast<uint64_t>(std::to_integer<uint8_t>(buf[preamble_size + i])) << (8 * i);
  return count;
}

int millis_until(clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, INT_MAX));
}

// One probe connection: a non-blocking socket that reads acks and writes frames from one thread.
class prober {
 public:
  prober(stream& io, clock::time_point warm_end) : io_(io), warm_end_(warm_end) {}

  uint64_t acked = 0;  // payload bytes confirmed by the server
  uint64_t acks = 0;   // ack frames read
  clock::time_point last_ack;
  std::optional<clock::time_point> window_start;
  uint64_t window_start_bytes = 0;
  bool streaming = false;  // acks after the warm-up open the window

  // Waits up to `timeout_ms` for acks (and for room to write when `want_write`), reads every
  // ack that arrived; returns whether the socket can take bytes now, or an error.
  result<bool> wait(bool want_write, int timeout_ms) {
    // read_acks reads until the socket would block, so TLS holds no whole ack that poll could
    // not see, and poll may sleep.
    pollfd pfd{io_.fd(), static_cast<short>(POLLIN | (want_write ? POLLOUT : 0)), 0};
    if (::poll(&pfd, 1, timeout_ms) < 0) pfd.revents = 0;
    if (pfd.revents & (POLLIN | POLLERR | POLLHUP))
      if (auto st = read_acks(); !st) return fail(st.error());
    return (pfd.revents & POLLOUT) != 0;
  }

 private:
  status read_acks() {
    for (;;) {
      auto step = io_.read_some(buf_ + have_, ack_size - have_);
      if (!step.error.empty()) return fail("no probe ack: " + step.error);
      have_ += step.bytes;
      if (have_ < ack_size) {
        if (step.would_block) return {};
        continue;
      }
      have_ = 0;
      auto count = decode_ack(buf_);
      if (!count) return fail(count.error());
      const auto now = clock::now();
      acked = *count;
      ++acks;
      last_ack = now;
      if (streaming && !window_start && now >= warm_end_) {
        window_start = now;
        window_start_bytes = acked;
      }
    }
  }

  stream& io_;
  clock::time_point warm_end_;
  std::byte buf_[ack_size];
  size_t have_ = 0;
};

}  // namespace

result<probe_result> probe_link(const std::string& host, uint16_t port, const probe_options& options) {
  const std::string where = "link probe to " + endpoint_name(host, port);
  const auto connect_deadline = clock::now() + options.connect_timeout;
  auto sock = connect_tcp(host, port, options.connect_timeout);
  if (!sock) return fail(sock.error());
  stream io(sock->fd());
  if (options.tls) {
    auto secured = tls_connect(sock->fd(), *options.tls, options.peer, connect_deadline, endpoint_name(host, port));
    if (!secured) return fail(where + ": " + secured.error());
    io = std::move(*secured);
  }
  if (auto st = set_nonblocking(sock->fd(), true); !st) return fail(where + ": " + st.error());
  probe_result out;
  const int ack_wait = static_cast<int>(std::min<int64_t>(options.ack_timeout.count(), INT_MAX));

  // Writes all of [data, data + n), reading acks meanwhile.
  auto write = [&](prober& p, const std::byte* data, size_t n) -> status {
    const auto give_up = clock::now() + options.ack_timeout;
    while (n > 0) {
      auto room = p.wait(true, ack_wait);
      if (!room) return fail(room.error());
      if (!*room && clock::now() >= give_up)
        return fail("cannot send for " + std::to_string(options.ack_timeout.count()) + " ms");
      if (!*room) continue;
      auto step = io.write_some(data, n);
      if (!step.error.empty()) return fail(step.error);
      data += step.bytes;
      n -= step.bytes;
    }
    return {};
  };

  // Latency first, on an idle connection: empty frames, one at a time.
  prober latency(io, clock::now());
  std::byte empty[preamble_size];
  encode_preamble({flag_probe | flag_ack_request, 0, 0}, empty);
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    const auto t = clock::now();
    if (auto st = write(latency, empty, preamble_size); !st) return fail(where + ": " + st.error());
    while (latency.acks <= static_cast<uint64_t>(i)) {
      auto r = latency.wait(false, millis_until(t + options.ack_timeout));
      if (!r) return fail(where + ": " + r.error());
      if (latency.acks <= static_cast<uint64_t>(i) && clock::now() >= t + options.ack_timeout)
        return fail(where + ": no probe ack for " + std::to_string(options.ack_timeout.count()) + " ms");
    }
    best = std::min(best, std::chrono::duration<double, std::milli>(latency.last_ack - t).count());
  }
  out.rtt_ms = best;

  const size_t frame_bytes = std::max<size_t>(options.frame_bytes, 1024);
  const uint64_t frame_wire = frame_bytes + preamble_size;
  std::vector<std::byte> frame(frame_wire, std::byte{0x5a});
  encode_preamble({flag_probe | flag_ack_request, 0, frame_bytes}, frame.data());

  const auto start = clock::now();
  prober p(io, start + options.warmup);
  p.streaming = true;
  p.last_ack = start;
  p.acked = latency.acked;
  uint64_t sent = latency.acked;  // the server's count includes the (empty) latency frames
  size_t off = 0;                  // bytes of the current frame written
  bool sending = true;
  std::string failure;
  for (;;) {
    if (sending && off == 0 && p.window_start) {
      const bool time_up = clock::now() - *p.window_start >= options.duration;
      const bool bytes_up = options.max_bytes > 0 && sent - p.window_start_bytes >= options.max_bytes;
      if (time_up || bytes_up) sending = false;
    }
    if (!sending && off == 0 && p.acked >= sent) break;
    // Keep about 0.5 s of traffic unacked (rate estimated from the acks so far).
    const double secs = std::chrono::duration<double>(p.last_ack - start).count();
    const double rate = p.acked > latency.acked && secs > 0 ? (p.acked - latency.acked) / secs : 0;
    const uint64_t window = std::clamp<uint64_t>(static_cast<uint64_t>(rate * 0.5), min_window, max_window);
    const bool room = sending && (off > 0 || sent < p.acked + window);
    const auto ack_deadline = p.last_ack + options.ack_timeout;
    // Sleeps until an ack arrives or (with room) the socket takes bytes: never spins.
    auto writable = p.wait(room, millis_until(ack_deadline));
    if (!writable) {
      failure = writable.error();
      break;
    }
    if (room && *writable) {
      auto step = io.write_some(frame.data() + off, frame.size() - off);
      if (!step.error.empty()) {
        failure = step.error;
        break;
      }
      off += step.bytes;
      if (off == frame.size()) {
        off = 0;
        sent += frame_bytes;
        ++out.frames;
      }
    } else if (p.acked < sent && clock::now() >= ack_deadline) {
      failure = std::string(sending ? "no ack" : "no final ack") + " for " +
                std::to_string(options.ack_timeout.count()) + " ms";
      break;
    }
  }
  io.close_notify();
  sock->shutdown();  // the server sees a clean end between frames
  if (!failure.empty()) return fail(where + ": " + failure);
  if (!p.window_start) return fail(where + ": no ack arrived after the warm-up");
  const uint64_t payload_bytes = p.acked - p.window_start_bytes;
  out.bytes = payload_bytes / frame_bytes * frame_wire;
  out.seconds = std::chrono::duration<double>(p.last_ack - *p.window_start).count();
  if (out.seconds <= 0 || out.bytes == 0) return fail(where + ": window too short to measure (raise the duration)");
  out.mbit_per_s = static_cast<double>(out.bytes) * 8 / out.seconds / 1e6;
  return out;
}

}  // namespace fusion::net
