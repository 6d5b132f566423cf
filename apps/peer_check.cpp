#include "apps/peer_check.hpp"

#include <poll.h>

#include <algorithm>

#include "net/socket.hpp"
#include "net/tls.hpp"

namespace fusion {

namespace {

using clock = std::chrono::steady_clock;

// Whether the peer sends something of its own within `wait`: a TLS server never speaks first,
// a plaintext CAF peer sends its handshake at once.
bool speaks_first(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) > 0 && (p.revents & POLLIN);
}

}  // namespace

std::string diagnose_connect(const std::string& address, const std::string& host, uint16_t port,
                             const security::identity_files* tls, std::chrono::milliseconds timeout) {
  auto sock = net::connect_tcp(host, port, timeout);
  if (!sock) {
    if (sock.error().find("refused") != std::string::npos) return "nothing listens on " + address + " (connection refused)";
    return address + " cannot be reached: " + sock.error();
  }
  const auto settle = std::min(timeout, std::chrono::milliseconds(500));
  const std::string not_tls = "the program at " + address +
                              " answers, but does not speak TLS: a fusion-train with security.mode=off (then connect "
                              "with --security.mode off), or another program on that port";
  if (!tls) {
    if (speaks_first(sock->fd(), settle)) return {};
    return "the program at " + address + " accepts connections but sends nothing to this plaintext client: it may "
           "require TLS (a fusion-train with security.mode=tls: connect with --security.certs DIR)";
  }
  if (speaks_first(sock->fd(), std::min(settle, std::chrono::milliseconds(200)))) return not_tls;
  auto ctx = net::tls_context::load(*tls);
  if (!ctx) return {};  // our own files: loading the credentials reports them
  auto checked = net::tls_handshake_check(sock->fd(), **ctx, clock::now() + timeout, settle);
  if (checked) return {};
  const std::string& why = checked.error();
  if (why.find("does not speak TLS") != std::string::npos || why == "it closed the connection")
    return not_tls;
  if (why.find("not issued by this cluster's CA") != std::string::npos)
    return "the TLS peer at " + address + " holds a certificate that the CA " + tls->ca +
           " did not sign: it runs with the certificates of another cluster (fusion-cluster certs); use the ones of "
           "its run";
  if (why.find("refused this process's certificate") != std::string::npos)
    return "the TLS peer at " + address + " refused this program's certificate " + tls->certificate +
           ": it trusts another CA than " + tls->ca + " (certificates of another run?)";
  return "the TLS handshake with " + address + " failed: " + why;
}

}  // namespace fusion
