#include "apps/prometheus.hpp"

#include <httplib.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace fusion {

namespace {

// One gauge: HELP, TYPE and the sample; NaN and infinity as Prometheus spells them.
void gauge(std::string& out, const char* name, const char* help, double value, const std::string& labels = {}) {
  char num[64];
  if (std::isnan(value)) std::snprintf(num, sizeof num, "NaN");
  else if (std::isinf(value)) std::snprintf(num, sizeof num, value > 0 ? "+Inf" : "-Inf");
  else std::snprintf(num, sizeof num, "%.17g", value);
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + labels + " " + num + "\n";
}

// A label value with Prometheus' escapes (backslash, double quote, newline).
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string prometheus_text(const prometheus_run_info& run, const step_record* last, double elapsed_s) {
  std::string out;
  gauge(out, "fusion_run_info", "The run: model and what items_per_second counts (always 1).", 1,
        "{model=\"" + label_value(run.model) + "\",items=\"" + label_value(run.items) + "\"}");
  gauge(out, "fusion_steps_target", "Optimizer steps the run is configured for (train.steps).",
        static_cast<double>(run.steps));
  gauge(out, "fusion_step", "Optimizer steps completed.", last ? static_cast<double>(last->step) : 0);
  gauge(out, "fusion_elapsed_seconds", "Seconds since training started.", elapsed_s);
  if (!last) return out;
  gauge(out, "fusion_loss", "Training loss of the last step (mean cross-entropy, nats).", last->loss);
  gauge(out, "fusion_learning_rate", "Learning rate of the last step.", last->lr);
  gauge(out, "fusion_grad_norm", "Global gradient norm of the last step, before clipping.", last->grad_norm);
  gauge(out, "fusion_items_per_second", "Tokens (or images) per second of the last step.", last->tokens_per_s,
        "{items=\"" + label_value(run.items) + "\"}");
  gauge(out, "fusion_step_seconds", "Wall time of the last step.", last->step_s);
  gauge(out, "fusion_predicted_step_seconds", "The workload estimator's prediction for the last step (0: none).",
        last->predicted_step_s);
  gauge(out, "fusion_boundary_seconds", "Coordinator idle time at the step boundary before the last step.",
        last->boundary_s);
  gauge(out, "fusion_update_seconds", "The optimizer update of the last step: update requests to the last reply.",
        last->update_s);
  double bytes = 0, dense = 0;
  for (auto& e : last->edges) {
    bytes += static_cast<double>(e.bytes);
    dense += static_cast<double>(e.dense_bytes);
  }
  gauge(out, "fusion_cross_process_bytes", "Bytes sent over cross-process edges in the last step.", bytes);
  gauge(out, "fusion_cross_process_dense_bytes", "The same tensors uncompressed.", dense);
  return out;
}

prometheus_server::prometheus_server(const std::string& host, uint16_t port, prometheus_run_info run)
    : server_(std::make_unique<httplib::Server>()), run_(std::move(run)) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      text = prometheus_text(run_, have_last_ ? &last_ : nullptr, elapsed_s_);
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("fusion-train: Prometheus metrics at /metrics\n", "text/plain");
  });
  int bound = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    throw std::runtime_error("cannot serve metrics on " + host + ":" + std::to_string(port) +
                             " (metrics.port): the address is in use or not this machine's");
  port_ = static_cast<uint16_t>(bound);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

prometheus_server::~prometheus_server() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void prometheus_server::set_items(const std::string& items) {
  std::lock_guard<std::mutex> guard(mutex_);
  run_.items = items;
}

void prometheus_server::update(const step_record& rec, double elapsed_s) {
  std::lock_guard<std::mutex> guard(mutex_);
  // Only the scalars and edge byte counts are read: the per-op measurements stay behind.
  last_.step = rec.step;
  last_.loss = rec.loss;
  last_.lr = rec.lr;
  last_.grad_norm = rec.grad_norm;
  last_.tokens_per_s = rec.tokens_per_s;
  last_.step_s = rec.step_s;
  last_.predicted_step_s = rec.predicted_step_s;
  last_.boundary_s = rec.boundary_s;
  last_.update_s = rec.update_s;
  last_.edges = rec.edges;
  have_last_ = true;
  elapsed_s_ = elapsed_s;
}

}  // namespace fusion
