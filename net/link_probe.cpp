#include "net/link_probe.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "net/frame_channel.hpp"

namespace fusion::net {

namespace {

using clock = std::chrono::steady_clock;

constexpr size_t ack_size = preamble_size + 8;
constexpr uint64_t min_window = uint64_t{1} << 20;
constexpr uint64_t max_window = uint64_t{64} << 20;

// Reads one ack frame; returns the server's cumulative payload byte count.
result<uint64_t> read_ack(int fd) {
  std::byte buf[ack_size];
  if (auto st = recv_all(fd, buf, ack_size); !st) return net_error{"no probe ack: " + st.error()};
  auto pre = decode_preamble(buf);
  if (!pre) return net_error{"bad probe ack: " + pre.error()};
  if (pre->flags != flag_ack || pre->meta_size != 8 || pre->payload_size != 0)
    return net_error{"bad probe ack: unexpected frame layout"};
  uint64_t count = 0;
  for (size_t i = 0; i < 8; ++i) count |= static_cast<uint64_t>(std::to_integer<uint8_t>(buf[preamble_size + i])) << (8 * i);
  return count;
}

// Acks as seen by the reader thread.
struct ack_state {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t acked = 0;              // payload bytes confirmed by the server
  clock::time_point last_ack;
  std::optional<clock::time_point> window_start;
  uint64_t window_start_bytes = 0;
  std::string error;
};

}  // namespace

result<probe_result> probe_link(const std::string& host, uint16_t port, const probe_options& options) {
  const std::string where = "link probe to " + endpoint_name(host, port);
  auto sock = connect_tcp(host, port, options.connect_timeout);
  if (!sock) return net_error{sock.error()};
  const int fd = sock->fd();
  probe_result out;

  // Latency first, on an idle connection: empty frames, one at a time.
  std::byte empty[preamble_size];
  encode_preamble({flag_probe | flag_ack_request, 0, 0}, empty);
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    auto t = clock::now();
    if (auto st = send_all(fd, empty, preamble_size); !st) return net_error{where + ": " + st.error()};
    if (auto ack = read_ack(fd); !ack) return net_error{where + ": " + ack.error()};
    best = std::min(best, std::chrono::duration<double, std::milli>(clock::now() - t).count());
  }
  out.rtt_ms = best;

  const size_t frame_bytes = std::max<size_t>(options.frame_bytes, 1024);
  const uint64_t frame_wire = frame_bytes + preamble_size;
  std::vector<std::byte> payload(frame_bytes, std::byte{0x5a});
  std::byte pre[preamble_size];
  encode_preamble({flag_probe | flag_ack_request, 0, frame_bytes}, pre);

  ack_state acks;
  const auto start = clock::now();
  const auto warm_end = start + options.warmup;
  std::thread reader([&] {
    for (;;) {
      auto count = read_ack(fd);
      auto now = clock::now();
      std::lock_guard lock(acks.mutex);
      if (!count) {
        acks.error = count.error();
        acks.cv.notify_all();
        return;
      }
      acks.acked = *count;
      acks.last_ack = now;
      if (!acks.window_start && now >= warm_end) {
        acks.window_start = now;
        acks.window_start_bytes = *count;
      }
      acks.cv.notify_all();
    }
  });

  uint64_t sent = 0;
  std::string failure;
  for (;;) {
    std::unique_lock lock(acks.mutex);
    // Keep about 0.5 s of traffic unacked (rate estimated from the acks so far).
    auto window = [&] {
      double secs = std::chrono::duration<double>(acks.last_ack - start).count();
      double rate = acks.acked > 0 && secs > 0 ? acks.acked / secs : 0;
      return std::clamp<uint64_t>(static_cast<uint64_t>(rate * 0.5), min_window, max_window);
    };
    if (!acks.cv.wait_for(lock, options.ack_timeout,
                          [&] { return !acks.error.empty() || sent < acks.acked + window(); })) {
      failure = "no ack for " + std::to_string(options.ack_timeout.count()) + " ms";
      break;
    }
    if (!acks.error.empty()) break;
    if (acks.window_start) {
      bool time_up = clock::now() - *acks.window_start >= options.duration;
      bool bytes_up = options.max_bytes > 0 && sent - acks.window_start_bytes >= options.max_bytes;
      if (time_up || bytes_up) break;
    }
    lock.unlock();
    iovec iov[2] = {{pre, preamble_size}, {payload.data(), frame_bytes}};
    if (auto st = writev_all(fd, iov, 2); !st) {
      failure = st.error();
      break;
    }
    sent += frame_bytes;
    ++out.frames;
  }
  if (failure.empty()) {
    // The window closes with the ack of the last byte sent.
    std::unique_lock lock(acks.mutex);
    if (!acks.cv.wait_for(lock, options.ack_timeout, [&] { return !acks.error.empty() || acks.acked >= sent; }))
      failure = "no final ack for " + std::to_string(options.ack_timeout.count()) + " ms";
  }
  sock->shutdown();  // wakes the reader; the server sees a clean end between frames
  reader.join();
  {
    std::lock_guard lock(acks.mutex);
    if (failure.empty() && acks.acked < sent) failure = acks.error;
    if (failure.empty() && !acks.window_start) failure = "no ack arrived after the warm-up";
    if (!failure.empty()) return net_error{where + ": " + failure};
    uint64_t payload_bytes = acks.acked - acks.window_start_bytes;
    out.bytes = payload_bytes / frame_bytes * frame_wire;
    out.seconds = std::chrono::duration<double>(acks.last_ack - *acks.window_start).count();
  }
  if (out.seconds <= 0 || out.bytes == 0) return net_error{where + ": window too short to measure (raise the duration)"};
  out.mbit_per_s = static_cast<double>(out.bytes) * 8 / out.seconds / 1e6;
  return out;
}

}  // namespace fusion::net
