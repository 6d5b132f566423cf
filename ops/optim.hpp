// Optimizer math: learning-rate schedule, global-norm gradient clipping, AdamW and SGD updates
// on flat float arrays. The op actor owns parameters, gradients and state and calls these per
// parameter tensor; the formulas follow PyTorch (torch.optim.AdamW / SGD, clip_grad_norm_) so a
// PyTorch reference run reproduces our trajectories.
//
// Shape legend: n elements of one parameter tensor (all arrays below have n elements).
#pragma once

#include <cstdint>
#include <string>

namespace fusion {

/// Optimizer settings of a training run.
struct optim_config {
  std::string kind = "adamw";  ///< "adamw" | "sgd"
  double lr = 1e-3;            ///< peak learning rate (reached at the end of warm-up)
  double min_lr = 1e-4;        ///< cosine floor, reached at total_steps
  double beta1 = 0.9;          ///< adamw
  double beta2 = 0.95;         ///< adamw
  double eps = 1e-8;           ///< adamw
  double weight_decay = 0.1;   ///< adamw: decoupled; sgd: coupled (added to the gradient)
  double momentum = 0.9;       ///< sgd (0: plain SGD)
  double grad_clip = 1.0;      ///< max global gradient norm; 0 turns clipping off (< 0 is rejected)
  int64_t warmup_steps = 0;
  int64_t total_steps = 1000;
  /// train.sync: 0 is `step` (the replicas all-reduce their gradients every step); H >= 1 is
  /// `local:H` (each replica steps on its own gradients, and every H steps the replicas average
  /// their parameter change and apply the outer optimizer: outer_update below, as DiLoCo does).
  int64_t sync_every = 0;
  double outer_lr = 0.7;        ///< train.outer-lr: the outer (Nesterov) optimizer's learning rate
  double outer_momentum = 0.9;  ///< train.outer-momentum: its momentum
};

/// Parses train.sync: "step" (0) or "local:H" with H a whole number >= 1 (H). False otherwise.
bool parse_sync(const std::string& text, int64_t& every);
/// train.sync as written: "step" or "local:H".
std::string sync_name(int64_t every);

/// Throws std::invalid_argument naming the first bad field (unknown kind, negative lr, betas
/// outside [0, 1), eps <= 0, negative weight decay or momentum, a negative or NaN grad_clip,
/// min_lr above lr, negative step counts).
void check_optim_config(const optim_config& c);

/// Number of float state arrays per parameter: 2 for adamw (m, v), 1 for sgd (momentum buffer).
int optim_state_count(const optim_config& c);

/// Learning rate of 0-based `step`: lr * (step+1) / warmup_steps while step < warmup_steps, then
/// cosine decay from lr (at step == warmup_steps) to min_lr (at step == total_steps), min_lr
/// after. Throws std::invalid_argument for a negative step.
double lr_at(const optim_config& c, int64_t step);

/// Factor to multiply gradients by so their global norm is at most grad_clip, as PyTorch's
/// clip_grad_norm_: grad_clip / (norm + 1e-6) when norm exceeds grad_clip, else 1 (also 1 when
/// clipping is off). A non-finite norm gives 0 or NaN, so callers should check the norm first.
float clip_scale(double global_grad_norm, double grad_clip);

/// One AdamW step (torch.optim.AdamW semantics) on p, with g multiplied by grad_scale first:
///     p -= lr * weight_decay * p                 (only when decay)
///     m  = beta1 * m + (1 - beta1) * g
///     v  = beta2 * v + (1 - beta2) * g^2
///     p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// `t` is the 1-based number of this step; m and v start at zero.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr,
                  const optim_config& c, bool decay, float grad_scale);

/// One SGD step (torch.optim.SGD, dampening 0, no Nesterov) with g multiplied by grad_scale:
///     g'  = g + weight_decay * p                 (only when decay)
///     buf = momentum * buf + g'                  (buf starts at zero)
///     p  -= lr * buf                             (p -= lr * g' when momentum == 0)
void sgd_update(float* p, const float* g, float* buf, int64_t n, double lr, const optim_config& c,
                bool decay, float grad_scale);

/// The outer step of local:H (DiLoCo's outer optimizer: torch.optim.SGD with nesterov, dampening
/// 0) on a parameter tensor from its value at the last sync, `anchor`, and the replicas' mean
/// pseudo-gradient `delta` (anchor - parameter now, averaged over replicas):
///     buf    = momentum * buf + delta            (buf starts at zero)
///     anchor = anchor - lr * (delta + momentum * buf)
/// `anchor` is then the parameter every replica takes. With lr 1 and momentum 0 it is
/// anchor - delta: the replicas' mean parameter (up to float rounding).
void outer_update(float* anchor, const float* delta, float* buf, int64_t n, double lr, double momentum);

/// Sum of x[i]^2 accumulated in double (for the global gradient norm).
double sum_of_squares(const float* x, int64_t n);

}  // namespace fusion
