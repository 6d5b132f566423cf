// Helpers shared by the net/ tests: a frame_server that collects what it receives, and
// deterministic payloads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "net/frame_channel.hpp"

namespace fusion::net::test {

/// Bytes whose value depends on the position and a seed, so misplaced data is caught.
inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<std::byte>(s >> 24);
  }
  return v;
}

struct received_frame {
  uint64_t connection = 0;
  std::string meta;
  std::vector<std::byte> payload;
  std::string error;
};

/// A frame_server whose handler allocates a fresh buffer per frame (refusing meta "refuse")
/// and records every completed frame and every reported error.
class collecting_server {
 public:
  explicit collecting_server(frame_server_options opts = {}) {
    auto s = frame_server::start(
        std::move(opts),
        [this](incoming_frame& f) -> frame_target {
          if (f.meta == "refuse") return frame_target::refuse("test refuses this frame");
          auto frame = std::make_shared<received_frame>();
          frame->connection = f.connection_id;
          frame->meta = std::move(f.meta);
          frame->payload.resize(f.payload_size);
          {
            std::lock_guard lock(mutex_);
            ++started_;
          }
          cv_.notify_all();
          return frame_target::into(frame->payload.data(), [this, frame](const status& received) {
            frame->error = received.error();
            std::lock_guard lock(mutex_);
            frames_.push_back(std::move(*frame));
            cv_.notify_all();
          });
        },
        [this](const channel_error& e) {
          std::lock_guard lock(mutex_);
          errors_.push_back(e);
          cv_.notify_all();
        });
    if (!s) throw std::runtime_error(s.error());
    server_ = std::move(*s);
  }

  frame_server& server() { return *server_; }
  uint16_t port() const { return server_->port(); }

  /// Waits until `n` frames completed (true) or 10 s passed (false).
  bool wait_frames(size_t n) { return wait([&] { return frames_.size() >= n; }); }
  bool wait_errors(size_t n) { return wait([&] { return errors_.size() >= n; }); }
  bool wait_started(size_t n) { return wait([&] { return started_ >= n; }); }

  std::vector<received_frame> frames() {
    std::lock_guard lock(mutex_);
    return frames_;
  }
  std::vector<channel_error> errors() {
    std::lock_guard lock(mutex_);
    return errors_;
  }

 private:
  template <class Pred>
  bool wait(Pred pred) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(10), pred);
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<received_frame> frames_;
  std::vector<channel_error> errors_;
  size_t started_ = 0;
  std::unique_ptr<frame_server> server_;
};

/// Polls `pred` for up to 10 s.
template <class Pred>
bool eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

}  // namespace fusion::net::test
