// Shape legend: n elements of one parameter tensor.
#include "ops/optim.hpp"

#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>

namespace fusion {

namespace {

// Names the option as a user writes it (optim.weight-decay), never the C++ field.
[[noreturn]] void bad_field(const char* option, const std::string& why) {
  throw std::invalid_argument(std::string(option) + " " + why);
}

// 0.001, 0.9, 1e-08: the value as a user would write it (std::to_string gives 0.001000).
std::string num(double v) {
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

void check_optim_config(const optim_config& c) {
  if (c.kind != "adamw" && c.kind != "sgd")
    bad_field("optim.kind", "must be \"adamw\" or \"sgd\", got \"" + c.kind + "\"");
  // `!(x >= 0)` also rejects NaN.
  if (!(c.lr >= 0)) bad_field("optim.lr", "must be >= 0, got " + num(c.lr));
  if (!(c.min_lr >= 0)) bad_field("optim.min-lr", "must be >= 0, got " + num(c.min_lr));
  if (!(c.beta1 >= 0 && c.beta1 < 1)) bad_field("optim.beta1", "must be in [0, 1), got " + num(c.beta1));
  if (!(c.beta2 >= 0 && c.beta2 < 1)) bad_field("optim.beta2", "must be in [0, 1), got " + num(c.beta2));
  if (!(c.eps > 0)) bad_field("optim.eps", "must be > 0, got " + num(c.eps));
  if (!(c.weight_decay >= 0)) bad_field("optim.weight-decay", "must be >= 0, got " + num(c.weight_decay));
  if (!(c.momentum >= 0 && c.momentum < 1))
    bad_field("optim.momentum", "must be in [0, 1), got " + num(c.momentum));
  if (std::isnan(c.grad_clip)) bad_field("optim.grad-clip", "is not a number (nan)");
  // A negative limit once meant "off" silently; 0 is the one way to say it.
  if (c.grad_clip < 0) bad_field("optim.grad-clip", "must be >= 0 (0 turns clipping off), got " + num(c.grad_clip));
  // The cosine schedule would otherwise rise from lr to min_lr: surely a typo.
  if (c.min_lr > c.lr)
    bad_field("optim.min-lr", "must not be above optim.lr (the cosine schedule falls from optim.lr to "
                              "optim.min-lr), got " + num(c.min_lr) + " above " + num(c.lr) + ": lower optim.min-lr too");
  if (c.warmup_steps < 0) bad_field("optim.warmup-steps", "must be >= 0, got " + std::to_string(c.warmup_steps));
  if (c.total_steps < 0) bad_field("optim.total-steps", "must be >= 0, got " + std::to_string(c.total_steps));
  if (c.sync_every < 0) bad_field("train.sync", "must be step or local:H with H >= 1, got local:" + std::to_string(c.sync_every));
  if (!(c.outer_lr > 0)) bad_field("train.outer-lr", "must be > 0, got " + num(c.outer_lr));
  if (!(c.outer_momentum >= 0 && c.outer_momentum < 1))
    bad_field("train.outer-momentum", "must be in [0, 1), got " + num(c.outer_momentum));
}

bool parse_sync(const std::string& text, int64_t& every) {
  if (text == "step") {
    every = 0;
    return true;
  }
  const std::string prefix = "local:";
  if (text.rfind(prefix, 0) != 0 || text.size() == prefix.size() || text.size() > prefix.size() + 9) return false;
  int64_t h = 0;
  for (size_t i = prefix.size(); i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    h = h * 10 + (text[i] - '0');
  }
  if (h < 1) return false;
  every = h;
  return true;
}

std::string sync_name(int64_t every) { return every <= 0 ? "step" : "local:" + std::to_string(every); }

void outer_update(float* anchor, const float* delta, float* buf, int64_t n, double lr, double momentum) {
  const auto lr_f = static_cast<float>(lr), mu = static_cast<float>(momentum);
  for (int64_t i = 0; i < n; ++i) {
    const float b = mu * buf[i] + delta[i];
    buf[i] = b;
    anchor[i] -= lr_f * (delta[i] + mu * b);
  }
}

int optim_state_count(const optim_config& c) {
  if (c.kind == "adamw") return 2;
  if (c.kind == "sgd") return 1;
  bad_field("optim.kind", "must be \"adamw\" or \"sgd\", got \"" + c.kind + "\"");
}

double lr_at(const optim_config& c, int64_t step) {
  if (step < 0) throw std::invalid_argument("learning-rate schedule: negative step " + std::to_string(step));
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (step >= c.total_steps) return c.min_lr;
  double progress = static_cast<double>(step - c.warmup_steps) /
                    static_cast<double>(c.total_steps - c.warmup_steps);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

float clip_scale(double global_grad_norm, double grad_clip) {
  if (grad_clip <= 0 || global_grad_norm <= grad_clip) return 1.0f;
  return static_cast<float>(grad_clip / (global_grad_norm + 1e-6));
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr,
                  const optim_config& c, bool decay, float grad_scale) {
  if (t < 1)
    throw std::invalid_argument("AdamW update: the step count must be >= 1 (1-based), got " + std::to_string(t));
  // Scalars in double, element math in float as PyTorch does for f32 parameters.
  const auto shrink = static_cast<float>(decay ? 1.0 - lr * c.weight_decay : 1.0);
  const auto b1 = static_cast<float>(c.beta1);
  const auto b2 = static_cast<float>(c.beta2);
  const auto one_minus_b1 = static_cast<float>(1.0 - c.beta1);
  const auto one_minus_b2 = static_cast<float>(1.0 - c.beta2);
  const double td = static_cast<double>(t);
  const auto step_size = static_cast<float>(lr / (1.0 - std::pow(c.beta1, td)));
  const auto inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(c.beta2, td)));
  const auto eps = static_cast<float>(c.eps);
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale;
    float mi = b1 * m[i] + one_minus_b1 * gi;
    float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * shrink - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, double lr, const optim_config& c,
                bool decay, float grad_scale) {
  const auto wd = static_cast<float>(decay ? c.weight_decay : 0.0);
  const auto mu = static_cast<float>(c.momentum);
  const auto lr_f = static_cast<float>(lr);
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale + wd * p[i];
    // With a zero-initialised buffer, momentum * 0 + g equals PyTorch's first-step buf = g.
    float bi = mu * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr_f * bi;
  }
}

double sum_of_squares(const float* x, int64_t n) {
  // Four independent accumulators let the compiler vectorise the double sum.
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) {
      double xi = x[i + k];
      acc[k] += xi * xi;
    }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace fusion
