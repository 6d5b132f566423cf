// Whole-buffer I/O over a connected TCP socket, in plaintext or through a TLS session
// (net/tls.hpp makes the sessions). The frame channel and the link probe read and write through
// a stream, so that they do not care which of the two carries their bytes.
//
// A stream does not own its descriptor (the caller's net::socket does, so that another thread
// can shutdown() it to wake a blocked reader or writer) but owns its TLS session. One thread at
// a time may use a stream: a TLS session has one state machine for both directions.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "net/socket.hpp"

struct iovec;
struct ssl_st;

namespace fusion::net {

/// Outcome of one non-blocking read or write: bytes moved (possibly 0 with `would_block`), or
/// an error (`closed_by_peer` on an orderly end).
struct io_step {
  size_t bytes = 0;
  bool would_block = false;
  std::string error;
};

/// Reads and writes whole buffers on a socket, through TLS when the stream has a session.
class stream {
 public:
  stream() = default;
  /// Plaintext on `fd`.
  explicit stream(int fd) noexcept : fd_(fd) {}
  /// TLS on `fd`: takes ownership of `ssl`, a session whose handshake (and the peer check of
  /// net/tls.hpp) has completed.
  stream(int fd, ssl_st* ssl) noexcept;
  ~stream();
  stream(stream&& o) noexcept;
  stream& operator=(stream&& o) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  int fd() const noexcept { return fd_; }
  /// True when the bytes go through TLS.
  bool secure() const noexcept { return ssl_ != nullptr; }
  /// The TLS session (null in plaintext), for net/tls.hpp's questions about the peer.
  ssl_st* native() const noexcept { return ssl_; }

  /// Writes all n bytes (blocking socket).
  status write_all(const void* data, size_t n);
  /// Writes every byte of iov[0..count) (consumed in place). In plaintext one sendmsg covers
  /// many pieces; through TLS, small pieces are gathered into one record and large ones are
  /// encrypted straight from the caller's memory.
  status writev_all(iovec* iov, int count);
  /// Reads exactly n bytes (blocking socket); `*received` as for net::recv_all.
  status read_all(void* data, size_t n, size_t* received = nullptr);
  /// read_all that gives up at `deadline` with `deadline_passed` (the whole read: a peer that
  /// trickles bytes cannot stretch it). The socket is blocking again on return.
  status read_all_by(void* data, size_t n, std::chrono::steady_clock::time_point deadline,
                     size_t* received = nullptr);

  /// Non-blocking transfers, for a socket switched with set_nonblocking(fd, true). TLS may hold
  /// bytes a poll cannot see: read until `would_block` before waiting for the socket again.
  io_step read_some(void* data, size_t n);
  io_step write_some(const void* data, size_t n);

  /// Through TLS: gathers encrypted records into `bytes` before they go to the socket, so that a
  /// large payload costs one system call per `bytes` instead of one per 16 KiB record. For
  /// blocking writers only (write_all, writev_all flush at their end). No-op in plaintext.
  void buffer_writes(size_t bytes);

  /// Tells a TLS peer that no more data follows (close_notify), best effort and without
  /// blocking (the socket is left non-blocking); nothing in plaintext. Call just before closing
  /// the socket on an orderly end.
  void close_notify() noexcept;

 private:
  status flush_staging();
  status tls_write(const void* data, size_t n);
  status flush_writes();

  int fd_ = -1;
  ssl_st* ssl_ = nullptr;
  std::vector<std::byte> staging_;  // small TLS writes gathered into one record
  bool buffered_writes_ = false;
};

/// Switches O_NONBLOCK on `fd`.
status set_nonblocking(int fd, bool on);

}  // namespace fusion::net
