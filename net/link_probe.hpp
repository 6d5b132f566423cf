// Link throughput and latency probe against a frame_server.
//
// Method (docs/transport.md): the client streams probe frames (flag_probe | flag_ack_request),
// which the server reads, discards and acknowledges one by one with the cumulative byte count.
// The rate is measured between two acknowledgements: the first ack that arrives after the
// warm-up (skipping TCP slow start and a tbf token-bucket burst) and the ack of the very last
// byte. Both ends of the window are receipts on the far side, so neither the sender's socket
// buffer nor the one-way latency inflates or deflates the rate. The sender keeps the unacked
// data within about half a second of traffic so that the pipe stays full on fast links while a
// slow link does not sit on megabytes of queued data at the end.
//
// One thread drives both directions with poll() on a non-blocking socket, because a TLS
// session cannot be read and written from two threads; acks are still stamped when they
// arrive, since the loop never blocks in a write.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <memory>

#include "net/socket.hpp"
#include "net/tls.hpp"

namespace fusion::net {

struct probe_options {
  /// Length of the measured window (after the warm-up); the probe ends at the ack of the last
  /// byte sent, so it lasts about warmup + duration + one round trip.
  std::chrono::milliseconds duration{2000};
  /// Traffic sent before the window opens and not counted.
  std::chrono::milliseconds warmup{500};
  /// When > 0, also stop after this many payload bytes in the window (whichever comes first).
  uint64_t max_bytes = 0;
  /// Payload bytes per probe frame (one ack each).
  size_t frame_bytes = size_t{256} << 10;
  std::chrono::milliseconds connect_timeout{5000};
  /// Give up when no ack arrives for this long (a dead or stalled link).
  std::chrono::milliseconds ack_timeout{20000};
  /// TLS 1.3 with these credentials (the server must hold `peer`'s certificate); null: plaintext.
  std::shared_ptr<const tls_context> tls;
  peer_rule peer;
};

struct probe_result {
  /// Bits of frame bytes (preamble + payload) per second in the window, / 1e6. TCP/IP headers
  /// are not counted, so on a link shaped to R the value reads about 0.95-0.97 R.
  double mbit_per_s = 0;
  /// Frame bytes and seconds of the measured window.
  uint64_t bytes = 0;
  double seconds = 0;
  /// Smallest round trip of an empty probe frame and its ack (three tries, before the stream).
  double rtt_ms = 0;
  /// Probe frames sent in total (warm-up included).
  uint64_t frames = 0;
};

/// Measures throughput and latency to a frame_server at host:port. Errors name the endpoint.
result<probe_result> probe_link(const std::string& host, uint16_t port, const probe_options& options = {});

}  // namespace fusion::net
