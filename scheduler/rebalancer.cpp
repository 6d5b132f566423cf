#include "scheduler/rebalancer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "scheduler/placement.hpp"

namespace fusion {

status rebalance_settings::check() const {
  auto at_least = [](const char* key, double v, double min) -> status {
    if (v >= min) return {};
    char buf[128];
    std::snprintf(buf, sizeof buf, "scheduler.%s must be at least %g, got %g", key, min, v);
    return fail(buf);
  };
  for (const auto& in_range : {at_least("every", static_cast<double>(every), 1),
                               at_least("horizon", static_cast<double>(horizon), 1),
                               at_least("confirmations", static_cast<double>(confirmations), 1)})
    if (!in_range) return in_range;
  if (first != 0 && first < 3)
    return fail("scheduler.first must be 0 (no early re-plan) or at least 3 (the estimator learns from step 3), got " +
                std::to_string(first));
  if (!(min_gain >= 0 && min_gain < 1))
    return fail("scheduler.min-gain must be a fraction in [0, 1), e.g. 0.1 for 10%, got " + std::to_string(min_gain));
  return {};
}

status rebalance_settings::set(const std::string& key_in, const std::string& value) {
  std::string key = key_in.rfind("scheduler.", 0) == 0 ? key_in.substr(10) : key_in;
  rebalance_settings next = *this;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  const bool number = !value.empty() && *end == '\0' && std::isfinite(v);
  auto whole = [&](int64_t& dst) -> status {
    if (!number || v != std::floor(v)) return fail("scheduler." + key + " takes a whole number, got '" + value + "'");
    // Beyond 2^53 a double no longer holds every whole number, and past 2^63 the cast wraps.
    if (std::fabs(v) > 9007199254740992.0)
      return fail("scheduler." + key + " takes a whole number of at most 2^53, got '" + value + "'");
    dst = static_cast<int64_t>(v);
    return {};
  };
  status parsed;
  if (key == "enabled") {
    if (value == "true" || value == "on" || value == "1")
      next.enabled = true;
    else if (value == "false" || value == "off" || value == "0")
      next.enabled = false;
    else
      parsed = fail("scheduler.enabled takes true or false, got '" + value + "'");
  } else if (key == "every") {
    parsed = whole(next.every);
  } else if (key == "horizon") {
    parsed = whole(next.horizon);
  } else if (key == "confirmations") {
    parsed = whole(next.confirmations);
  } else if (key == "first") {
    parsed = whole(next.first);
  } else if (key == "min-gain") {
    if (!number) parsed = fail("scheduler.min-gain takes a number, got '" + value + "'");
    next.min_gain = v;
  } else {
    return fail("unknown setting '" + key_in + "' (scheduler.enabled, scheduler.every, scheduler.min-gain, "
                "scheduler.horizon, scheduler.confirmations, scheduler.first)");
  }
  if (!parsed) return parsed;
  if (auto in_range = next.check(); !in_range) return in_range;
  *this = next;
  return {};
}

double migration_cost_s(const workload_estimator& est, const placement& from, const placement& to) {
  std::map<std::pair<int, int>, double> per_pair;
  for (auto [op, r] : arriving_replicas(from, to)) {
    const int a = from.node_of_op[op], b = to.node_of(op, r);
    per_pair[{a, b}] += est.transfer_s(est.state_bytes(op), a, b);
  }
  double worst = 0;
  for (auto& [pair, s] : per_pair) worst = std::max(worst, s);
  return worst;
}

const char* to_string(rebalance_decision::verdict v) {
  switch (v) {
    case rebalance_decision::verdict::keep: return "keep";
    case rebalance_decision::verdict::wait: return "wait";
    case rebalance_decision::verdict::migrate: return "migrate";
  }
  return "?";
}

rebalancer::rebalancer(rebalance_settings s) : settings_(s) {}

namespace {

// The judgement of assess and judge_first: the cost spread over `horizon` steps; moved to when it
// gains more than min-gain and has been confirmed `needed` times.
rebalance_decision weigh(const workload_estimator& est, const plan& current, const plan& target, int64_t confirmed,
                         const rebalance_settings& settings, int64_t horizon_steps, int64_t needed, const char* prefix) {
  rebalance_decision d;
  d.target = target.where;
  d.moved_ops = changed_ops(current.where, target.where);
  d.before_s = est.simulate(current).step_s;
  if (same_placement(current.where, target.where)) {
    d.after_s = d.before_s;
    d.reason = std::string(prefix) + "the re-planned placement is the running one (predicted step " +
               seconds_text(d.before_s) + ")";
    return d;
  }
  // A move keeps the running schedule (replan): the target is judged under it, not under the
  // schedule its plan was wired with.
  plan judged = target;
  judged.schedule = current.schedule;
  d.after_s = est.simulate(judged).step_s;
  d.cost_s = migration_cost_s(est, current.where, target.where);
  const double horizon = static_cast<double>(std::max<int64_t>(horizon_steps, 1));
  d.gain = d.before_s > 0 ? (d.before_s - d.after_s - d.cost_s / horizon) / d.before_s : 0;
  d.confirmed = d.gain > settings.min_gain ? confirmed : 0;
  if (d.gain <= settings.min_gain)
    d.what = rebalance_decision::verdict::keep;
  else if (d.confirmed < needed)
    d.what = rebalance_decision::verdict::wait;
  else
    d.what = rebalance_decision::verdict::migrate;
  char buf[360];
  std::snprintf(buf, sizeof buf,
                "%smoving %zu op(s): predicted step %s -> %s, migration %s over %lld steps: gain %.1f%% (threshold "
                "%.1f%%), confirmed %lld/%lld",
                prefix, d.moved_ops.size(), seconds_text(d.before_s).c_str(), seconds_text(d.after_s).c_str(),
                seconds_text(d.cost_s).c_str(), static_cast<long long>(horizon_steps), d.gain * 100,
                settings.min_gain * 100, static_cast<long long>(d.confirmed), static_cast<long long>(needed));
  d.reason = buf;
  return d;
}

}  // namespace

rebalance_decision rebalancer::assess(const workload_estimator& est, const plan& current, const plan& target,
                                      int64_t confirmed) const {
  return weigh(est, current, target, confirmed, settings_, settings_.horizon, settings_.confirmations, "");
}

rebalance_decision rebalancer::judge_first(const workload_estimator& est, const plan& current, const plan& proposal,
                                           int64_t remaining_steps) const {
  return weigh(est, current, proposal, 1, settings_, remaining_steps, 1, "first re-plan on measured steps: ");
}

rebalance_decision rebalancer::judge(const workload_estimator& est, const plan& current, const plan& proposal) const {
  if (candidate_) {
    auto again = assess(est, current, *candidate_, confirmed_ + 1);
    if (again.what != rebalance_decision::verdict::keep) return again;
  }
  return assess(est, current, proposal, 1);
}

rebalance_decision rebalancer::evaluate(const workload_estimator& est, const plan& current, const plan& proposal) {
  auto d = judge(est, current, proposal);
  if (d.what == rebalance_decision::verdict::wait) {
    if (!candidate_ || !same_placement(candidate_->where, d.target)) candidate_ = proposal;
    confirmed_ = d.confirmed;
  } else {
    reset();
  }
  return d;
}

void rebalancer::reset() {
  candidate_.reset();
  confirmed_ = 0;
}

void rebalancer::configure(rebalance_settings s) {
  settings_ = s;
  reset();
}

}  // namespace fusion
