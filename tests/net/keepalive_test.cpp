// TCP keepalive on the data channel's connections: a peer gone without a FIN (a cut link) must
// end the reader that waits on it. A child process in a network namespace of its own connects
// over its loopback, then takes the loopback down: packets vanish and no FIN arrives, as on a
// cut link. Needs root (unshare) and `ip`; skipped otherwise.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "net/frame_channel.hpp"
#include "net/socket.hpp"
#include "net_test_util.hpp"

using namespace fusion::net;
using namespace fusion::net::test;

namespace {

int option_of(int fd, int level, int name) {
  int v = -1;
  socklen_t n = sizeof v;
  return ::getsockopt(fd, level, name, &v, &n) == 0 ? v : -1;
}

// Exit codes of the child: what went wrong, for the parent's message.
enum child_exit : int { passed = 0, no_reader_end = 3, ended_early = 4, not_timed_out = 5, set_up_failed = 6, skip = 77 };

int half_open_child() {
  if (::unshare(CLONE_NEWNET) != 0 || std::system("ip link set lo up 2>/dev/null") != 0) return skip;
  std::atomic<bool> closed{false};
  frame_server_options o;
  o.keepalive = keepalive_options{std::chrono::seconds(1), std::chrono::seconds(1), 2};
  o.on_closed = [&](uint64_t) { closed = true; };
  try {
    collecting_server srv(o);
    auto tx = frame_sender::connect("127.0.0.1", srv.port(), {});
    if (!tx.ok()) return set_up_failed;
    auto payload = std::make_shared<std::vector<std::byte>>(pattern(1000, 1));
    (void)(*tx)->send("before the cut", payload->data(), payload->size(), payload, [](const status&) {});
    if (!srv.wait_frames(1) || std::system("ip link set lo down") != 0) return set_up_failed;
    const auto cut = std::chrono::steady_clock::now();
    while (!closed && std::chrono::steady_clock::now() - cut < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    if (!closed) return no_reader_end;
    if (after < 1.0) return ended_early;  // something other than the keepalive ended it
    bool said = false;
    for (auto& e : srv.errors()) said |= timed_out(e.message);
    // _Exit: the sender's and server's teardown over a dead loopback is not under test.
    std::_Exit(said ? passed : not_timed_out);
  } catch (...) {
    return set_up_failed;
  }
}

}  // namespace

TEST_CASE("net connections made and accepted have TCP keepalive on, with its default timings") {
  auto listener = listen_tcp("127.0.0.1", 0, 4);
  REQUIRE_MESSAGE(listener.ok(), listener.error());
  sockaddr_in a{};
  socklen_t n = sizeof a;
  REQUIRE(::getsockname(listener->fd(), reinterpret_cast<sockaddr*>(&a), &n) == 0);
  auto out = connect_tcp("127.0.0.1", ntohs(a.sin_port));
  REQUIRE_MESSAGE(out.ok(), out.error());
  auto in = accept_tcp(*listener);
  REQUIRE_MESSAGE(in.ok(), in.error());
  const keepalive_options k;
  for (int fd : {out->fd(), in->fd()}) {
    CHECK(option_of(fd, SOL_SOCKET, SO_KEEPALIVE) == 1);
    CHECK(option_of(fd, IPPROTO_TCP, TCP_KEEPIDLE) == k.idle.count());
    CHECK(option_of(fd, IPPROTO_TCP, TCP_KEEPINTVL) == k.interval.count());
    CHECK(option_of(fd, IPPROTO_TCP, TCP_KEEPCNT) == k.probes);
  }
  // The texts a read gives when the peer stopped answering, over plain TCP and TLS.
  CHECK(timed_out("receive failed: Connection timed out"));
  CHECK(timed_out("closed mid-frame after 3 of 9 payload bytes (TLS transfer failed: Connection timed out)"));
  CHECK_FALSE(timed_out(closed_by_peer));
  CHECK_FALSE(timed_out("receive failed: Connection reset by peer"));
}

TEST_CASE("net a reader whose peer vanished without a FIN ends at its keepalive, reporting a time-out") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) std::_Exit(half_open_child());
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      FAIL("the child did not finish within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(WIFEXITED(status));
  const int code = WEXITSTATUS(status);
  if (code == skip) {
    MESSAGE("skipped: needs root to make a network namespace, and ip(8)");
    return;
  }
  INFO("child exit " << code << " (3: the reader did not end within 20 s, 4: it ended before the keepalive "
                                "could, 5: no time-out reported, 6: set-up failed)");
  CHECK(code == passed);
}
