// fusion-train's live figures in Prometheus' text exposition format (version 0.0.4) over HTTP:
// GET /metrics on metrics.host:metrics.port (loopback by default). The coordinator hands every
// finished step to update(); the server thread renders the newest one on each scrape.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/metrics_record.hpp"

namespace httplib {
class Server;
}

namespace fusion {

/// What the exporter shows besides the last step.
struct prometheus_run_info {
  std::string model;
  std::string items = "tokens";  ///< what items_per_second counts: tokens or images
  int64_t steps = 0;             ///< train.steps, the run's target
};

/// The text of one scrape: one gauge per figure, with HELP and TYPE lines.
std::string prometheus_text(const prometheus_run_info& run, const step_record* last, double elapsed_s);

/// An HTTP server answering GET /metrics; stops and joins its thread when destroyed.
class prometheus_server {
 public:
  /// Binds `host`:`port` (0: any free port). Throws std::runtime_error naming the address.
  prometheus_server(const std::string& host, uint16_t port, prometheus_run_info run);
  ~prometheus_server();
  prometheus_server(const prometheus_server&) = delete;
  prometheus_server& operator=(const prometheus_server&) = delete;

  uint16_t port() const { return port_; }
  /// What items_per_second counts ("tokens" or "images"), once the model is loaded.
  void set_items(const std::string& items);
  /// Called from the coordinator after every step (cheap: copies the scalars under a lock).
  void update(const step_record& rec, double elapsed_s);

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
  std::mutex mutex_;
  prometheus_run_info run_;
  step_record last_;
  bool have_last_ = false;
  double elapsed_s_ = 0;
};

}  // namespace fusion
