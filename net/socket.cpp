#include "net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

namespace fusion::net {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

struct addrinfo_deleter {
  void operator()(addrinfo* p) const noexcept { freeaddrinfo(p); }
};
using addrinfo_ptr = std::unique_ptr<addrinfo, addrinfo_deleter>;

result<addrinfo_ptr> resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const char* node = host.empty() ? nullptr : host.c_str();
  if (passive && host == "0.0.0.0") node = nullptr;
  addrinfo* list = nullptr;
  auto service = std::to_string(port);
  int rc = getaddrinfo(node, service.c_str(), &hints, &list);
  if (rc != 0) return fail("cannot resolve " + endpoint_name(host, port) + ": " + gai_strerror(rc));
  return addrinfo_ptr(list);
}

// Waits for a non-blocking connect to finish; returns the socket error (0 on success).
int finish_connect(int fd, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return errno;
    if (rc == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return errno;
    return err;
  }
}

}  // namespace

socket& socket::operator=(socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void socket::close() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

void socket::shutdown() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

uint16_t socket::local_port() const noexcept {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) < 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

std::string socket::peer_name() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) < 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return endpoint_name(host, static_cast<uint16_t>(std::atoi(serv)));
}

result<socket> listen_tcp(const std::string& host, uint16_t port, int backlog) {
  auto list = resolve(host, port, true);
  if (!list) return fail(list.error());
  std::string last = "no address";
  for (addrinfo* ai = list->get(); ai; ai = ai->ai_next) {
    socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) < 0 || ::listen(s.fd(), backlog) < 0) {
      last = errno_text(errno);
      continue;
    }
    return s;
  }
  return fail("cannot listen on " + endpoint_name(host, port) + ": " + last);
}

result<socket> connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  auto list = resolve(host, port, false);
  if (!list) return fail(list.error());
  std::string last = "no address";
  for (addrinfo* ai = list->get(); ai; ai = ai->ai_next) {
    socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!s.valid()) {
      last = errno_text(errno);
      continue;
    }
    // Non-blocking connect so the timeout holds even when SYNs are dropped (a dead site).
    int err = 0;
    if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) < 0) {
      err = errno == EINPROGRESS ? finish_connect(s.fd(), timeout) : errno;
    }
    if (err != 0) {
      last = err == ETIMEDOUT ? "timed out after " + std::to_string(timeout.count()) + " ms" : errno_text(err);
      continue;
    }
    int flags = fcntl(s.fd(), F_GETFL);
    fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
    (void)set_nodelay(s.fd());
    (void)set_keepalive(s.fd());
    return s;
  }
  return fail("cannot connect to " + endpoint_name(host, port) + ": " + last);
}

result<socket> accept_tcp(const socket& listener) {
  for (;;) {
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      (void)set_nodelay(fd);
      (void)set_keepalive(fd);
      return socket(fd);
    }
    // Transient per-connection failures must not end the accept loop.
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    return fail("accept failed: " + errno_text(errno));
  }
}

status send_all(int fd, const void* data, size_t n) {
  iovec iov{const_cast<void*>(data), n};
  return writev_all(fd, &iov, 1);
}

status writev_all(int fd, iovec* iov, int count) {
  // Skip empty entries up front so that a zero-length payload needs no special case.
  while (count > 0 && iov->iov_len == 0) ++iov, --count;
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(count, IOV_MAX));
    // sendmsg instead of writev: MSG_NOSIGNAL turns a dead peer into EPIPE, not SIGPIPE.
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("send failed: " + errno_text(errno));
    }
    auto left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov, --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
    while (count > 0 && iov->iov_len == 0) ++iov, --count;
  }
  return {};
}

bool poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  if (left <= 0) return false;
  pollfd pfd{fd, events, 0};
  return ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left + 1, INT_MAX))) != 0;
}

status recv_all(int fd, void* data, size_t n, size_t* received) {
  auto* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (received) *received = got;
    if (r == 0) return fail(closed_by_peer);
    if (errno == EINTR) continue;
    return fail("receive failed: " + errno_text(errno));
  }
  if (received) *received = got;
  return {};
}

status set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
    return fail("TCP_NODELAY: " + errno_text(errno));
  return {};
}

status set_keepalive(int fd, const keepalive_options& k) {
  const int on = 1, idle = static_cast<int>(k.idle.count()), interval = static_cast<int>(k.interval.count());
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) < 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) < 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) < 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.probes, sizeof(k.probes)) < 0)
    return fail("TCP keepalive: " + errno_text(errno));
  return {};
}

bool timed_out(const std::string& error) { return error.find(std::strerror(ETIMEDOUT)) != std::string::npos; }

status set_buffer_sizes(int fd, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)) < 0)
    return fail("SO_SNDBUF/SO_RCVBUF: " + errno_text(errno));
  return {};
}

std::string endpoint_name(const std::string& host, uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace fusion::net
