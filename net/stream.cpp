#include "net/stream.hpp"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace fusion::net {

namespace {

// Pieces up to one TLS record are gathered (a preamble, a meta, a small payload); larger ones
// are encrypted from where they lie. The staging buffer holds a few records' worth.
constexpr size_t gather_piece = 16 << 10;
constexpr size_t staging_bytes = 64 << 10;

// What an SSL_read_ex / SSL_write_ex call that moved nothing means.
io_step tls_failure(ssl_st* ssl, int rc) {
  io_step step;
  switch (SSL_get_error(ssl, rc)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      step.would_block = true;
      return step;
    case SSL_ERROR_ZERO_RETURN:
      step.error = closed_by_peer;
      return step;
    case SSL_ERROR_SYSCALL: {
      const int err = errno;
      ERR_clear_error();
      if (err == EINTR) {
        step.would_block = true;  // the caller retries
        return step;
      }
      step.error = err == 0 ? std::string(closed_by_peer) : std::string("TLS transfer failed: ") + std::strerror(err);
      return step;
    }
    default: {
      unsigned long code = ERR_get_error();
      ERR_clear_error();
      const char* why = code ? ERR_reason_error_string(code) : nullptr;
      step.error = std::string("TLS transfer failed: ") + (why ? why : "protocol error");
      return step;
    }
  }
}

}  // namespace

stream::stream(int fd, ssl_st* ssl) noexcept : fd_(fd), ssl_(ssl) {}

stream::~stream() {
  if (ssl_) SSL_free(ssl_);
}

stream::stream(stream&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      ssl_(std::exchange(o.ssl_, nullptr)),
      staging_(std::move(o.staging_)),
      buffered_writes_(std::exchange(o.buffered_writes_, false)) {}

stream& stream::operator=(stream&& o) noexcept {
  if (this != &o) {
    if (ssl_) SSL_free(ssl_);
    fd_ = std::exchange(o.fd_, -1);
    ssl_ = std::exchange(o.ssl_, nullptr);
    staging_ = std::move(o.staging_);
    buffered_writes_ = std::exchange(o.buffered_writes_, false);
  }
  return *this;
}

io_step stream::read_some(void* data, size_t n) {
  io_step step;
  if (n == 0) return step;
  if (!ssl_) {
    ssize_t r = ::recv(fd_, data, n, MSG_DONTWAIT);
    if (r > 0) step.bytes = static_cast<size_t>(r);
    else if (r == 0) step.error = closed_by_peer;
    else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) step.would_block = true;
    else step.error = std::string("receive failed: ") + std::strerror(errno);
    return step;
  }
  ERR_clear_error();  // SSL_get_error reads this thread's queue, which must hold only our errors
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, data, n, &got);
  if (rc == 1) {
    step.bytes = got;
    return step;
  }
  return tls_failure(ssl_, rc);
}

io_step stream::write_some(const void* data, size_t n) {
  io_step step;
  if (n == 0) return step;
  if (!ssl_) {
    ssize_t r = ::send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) step.bytes = static_cast<size_t>(r);
    else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) step.would_block = true;
    else step.error = std::string("send failed: ") + std::strerror(errno);
    return step;
  }
  ERR_clear_error();
  size_t put = 0;
  const int rc = SSL_write_ex(ssl_, data, n, &put);
  if (rc == 1) {
    step.bytes = put;
    return step;
  }
  return tls_failure(ssl_, rc);
}

status stream::tls_write(const void* data, size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    // Blocking socket: a write moves at least one record or fails (would_block only on EINTR).
    auto step = write_some(p, n);
    if (!step.error.empty()) return fail(step.error);
    p += step.bytes;
    n -= step.bytes;
  }
  return {};
}

status stream::flush_writes() {
  if (!buffered_writes_) return {};
  ERR_clear_error();
  errno = 0;
  if (BIO_flush(SSL_get_wbio(ssl_)) > 0) return {};
  const int err = errno;
  ERR_clear_error();
  return fail(std::string("TLS transfer failed: ") + (err ? std::strerror(err) : "cannot flush the send buffer"));
}

status stream::write_all(const void* data, size_t n) {
  if (!ssl_) return send_all(fd_, data, n);
  if (auto st = tls_write(data, n); !st) return st;
  return flush_writes();
}

status stream::flush_staging() {
  auto st = tls_write(staging_.data(), staging_.size());
  staging_.clear();
  return st;
}

status stream::writev_all(iovec* iov, int count) {
  if (!ssl_) return net::writev_all(fd_, iov, count);
  // One SSL_write per piece would make a record (and a system call) of every 20-byte preamble.
  for (int i = 0; i < count; ++i) {
    const auto* p = static_cast<const std::byte*>(iov[i].iov_base);
    const size_t n = iov[i].iov_len;
    if (n <= gather_piece) {
      if (staging_.size() + n > staging_bytes)
        if (auto st = flush_staging(); !st) return st;
      staging_.insert(staging_.end(), p, p + n);
      continue;
    }
    if (!staging_.empty())
      if (auto st = flush_staging(); !st) return st;
    if (auto st = tls_write(p, n); !st) return st;
  }
  if (!staging_.empty())
    if (auto st = flush_staging(); !st) return st;
  return flush_writes();
}

void stream::buffer_writes(size_t bytes) {
  if (!ssl_ || buffered_writes_) return;
  BIO* socket_bio = SSL_get_wbio(ssl_);
  BIO* buffer = BIO_new(BIO_f_buffer());
  if (!buffer || BIO_set_write_buffer_size(buffer, static_cast<long>(bytes)) != 1) {
    BIO_free(buffer);
    ERR_clear_error();
    return;  // unbuffered writes still work, only slower
  }
  BIO_up_ref(socket_bio);  // now held by the buffer too; SSL_set0_wbio drops the session's own
  BIO_push(buffer, socket_bio);
  SSL_set0_wbio(ssl_, buffer);
  buffered_writes_ = true;
}

status stream::read_all(void* data, size_t n, size_t* received) {
  if (!ssl_) return recv_all(fd_, data, n, received);
  auto* p = static_cast<std::byte*>(data);
  size_t got = 0;
  while (got < n) {
    auto step = read_some(p + got, n - got);
    got += step.bytes;
    if (!step.error.empty()) {
      if (received) *received = got;
      return fail(step.error);
    }
  }
  if (received) *received = got;
  return {};
}

status stream::read_all_by(void* data, size_t n, std::chrono::steady_clock::time_point deadline, size_t* received) {
  if (auto st = set_nonblocking(fd_, true); !st) return st;
  auto* p = static_cast<std::byte*>(data);
  size_t got = 0;
  status result;
  while (got < n) {
    auto step = read_some(p + got, n - got);
    got += step.bytes;
    if (!step.error.empty()) {
      result = fail(step.error);
      break;
    }
    // would_block: the socket is drained and a record is incomplete, so poll is right to wait.
    if (step.would_block && !poll_until(fd_, POLLIN, deadline)) {
      result = fail(deadline_passed);
      break;
    }
  }
  if (received) *received = got;
  if (auto st = set_nonblocking(fd_, false); !st && result) return st;
  return result;
}

void stream::close_notify() noexcept {
  if (!ssl_) return;
  // Never wait for a peer that stopped reading: the alert goes out if the socket takes it. A
  // socket that refuses non-blocking mode only means the alert may wait: nothing to report.
  (void)set_nonblocking(fd_, true);
  ERR_clear_error();
  SSL_shutdown(ssl_);  // sends our close_notify; we do not wait for the peer's
  if (buffered_writes_) BIO_flush(SSL_get_wbio(ssl_));
  ERR_clear_error();
}

status set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) return fail(std::string("fcntl failed: ") + std::strerror(errno));
  const int want = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
  if (want != flags && ::fcntl(fd, F_SETFL, want) < 0) return fail(std::string("fcntl failed: ") + std::strerror(errno));
  return {};
}

}  // namespace fusion::net
