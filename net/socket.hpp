// Thin TCP layer for the bulk data channel: an RAII descriptor, listen/connect/accept, and
// blocking I/O loops that survive EINTR and partial transfers.
//
// Errors are values (result / status of base/result.hpp), never exceptions, because every caller runs on
// a channel thread where an escaping exception would terminate the process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "base/result.hpp"

struct iovec;

namespace fusion::net {

using fusion::fail;
using fusion::failure;
using fusion::result;
using fusion::status;

/// Owning file descriptor of a TCP socket; closes on destruction, move-only.
class socket {
 public:
  socket() = default;
  explicit socket(int fd) noexcept : fd_(fd) {}
  ~socket() { close(); }
  socket(socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  socket& operator=(socket&& o) noexcept;
  socket(const socket&) = delete;
  socket& operator=(const socket&) = delete;

  /// The raw descriptor (-1 when empty).
  int fd() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  /// Closes the descriptor now (idempotent).
  void close() noexcept;
  /// shutdown(SHUT_RDWR): wakes threads blocked in recv/send/accept on this socket without
  /// closing the descriptor, so they can be joined before the number is reused.
  void shutdown() noexcept;
  /// Port the socket is bound to (0 on error); use after listen_tcp with port 0.
  uint16_t local_port() const noexcept;
  /// "host:port" of the peer, or "?" when unknown.
  std::string peer_name() const;

 private:
  int fd_ = -1;
};

/// Binds and listens on host:port ("" or "0.0.0.0" = all interfaces, port 0 = any free port)
/// with SO_REUSEADDR.
result<socket> listen_tcp(const std::string& host, uint16_t port, int backlog = 64);

/// Connects with a timeout. Errors read like "cannot connect to 10.77.0.12:7701: Connection
/// refused". The returned socket is blocking and has TCP_NODELAY set.
result<socket> connect_tcp(const std::string& host, uint16_t port,
                           std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Blocks until a connection arrives; fails once the listener is shut down. The returned socket
/// has TCP_NODELAY and keepalive (keepalive_options' defaults) set.
result<socket> accept_tcp(const socket& listener);

/// Writes all n bytes (EINTR and partial writes handled, no SIGPIPE).
status send_all(int fd, const void* data, size_t n);

/// Writes every byte described by iov[0..count) in as few system calls as possible. The iovec
/// array is consumed (modified in place).
status writev_all(int fd, iovec* iov, int count);

/// recv_all's error text when the peer closed the connection in an orderly way.
inline constexpr const char* closed_by_peer = "connection closed by peer";

/// Reads exactly n bytes. On failure `*received` (when given) holds how many bytes did arrive,
/// so that callers can tell a clean close between messages (0) from a truncated one.
status recv_all(int fd, void* data, size_t n, size_t* received = nullptr);

/// The error text of a read that gave up at its deadline (stream::read_all_by).
inline constexpr const char* deadline_passed = "deadline passed";

/// Waits until poll() reports `events` on fd or `deadline` passes; false when it passed. An
/// interrupted poll counts as ready: the caller's next attempt finds out.
bool poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline);

/// Disables Nagle (small frames and acks must not wait for 40 ms timers).
status set_nodelay(int fd);

/// TCP keepalive: after `idle` without traffic the kernel probes the peer every `interval`, and
/// after `probes` unanswered probes the connection fails (a read or write then reports "timed
/// out"). A peer gone without a FIN (a cut link, a host switched off) would otherwise leave a
/// connection that only reads waiting forever; a connection that carries traffic or whose peer
/// answers is never touched.
struct keepalive_options {
  std::chrono::seconds idle{60};
  std::chrono::seconds interval{10};
  int probes = 6;
};

/// Turns TCP keepalive on with `k` (connect_tcp and accept_tcp do so with the defaults).
status set_keepalive(int fd, const keepalive_options& k = {});

/// Whether an I/O error text (plain or TLS) says the connection timed out: its peer stopped
/// answering keepalive probes or retransmissions (ETIMEDOUT), so it vanished, as opposed to
/// closing, resetting or sending something wrong.
bool timed_out(const std::string& error);

/// Sets SO_SNDBUF and SO_RCVBUF to `bytes`. Note that fixing the size turns off Linux's buffer
/// auto-tuning; the loopback benchmark found autotuning (bytes = 0, the default everywhere in
/// net/) at least as fast, see docs/transport.md.
status set_buffer_sizes(int fd, int bytes);

/// "host:port", with brackets around IPv6 literals.
std::string endpoint_name(const std::string& host, uint16_t port);


}  // namespace fusion::net
