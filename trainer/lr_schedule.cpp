// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (WarmupCosineLR in its
// DeepSpeed 0.19 form, with the cosine progress clamped to 1). The arithmetic keeps DeepSpeed's order
// of operations (e.g. multiplying by 1/log(N) rather than dividing by log(N)) so that the learning
// rates round exactly as DeepSpeed's do.
#include "trainer/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

// N: DeepSpeed warms up over at least 2 steps (N = 1 would make the log warmup divide by log(1) = 0).
int64_t warmup_steps(const SchedulerConfig& c) {
  return std::max<int64_t>(2, c.warmup_num_steps);
}

// Warmup progress γ for 0 <= k < N: 0 at k = 0, rising towards 1.
double warmup_gamma(const SchedulerConfig& c, int64_t k) {
  const int64_t n = warmup_steps(c);
  if (c.warmup_type == "linear") return static_cast<double>(k) / static_cast<double>(n);
  const double inverse_log_n = 1.0 / std::log(static_cast<double>(n));
  return inverse_log_n * std::log(static_cast<double>(k + 1));
}

// γ of WarmupDecayLR after the warmup (k >= N): linear from 1 at k = N down to 0 at k = T, then 0.
double decay_gamma(const SchedulerConfig& c, int64_t k) {
  const int64_t decay_steps = std::max<int64_t>(1, c.total_num_steps - warmup_steps(c));
  return std::max(0.0, static_cast<double>(c.total_num_steps - k) / static_cast<double>(decay_steps));
}

// WarmupLR / WarmupDecayLR: interpolates from warmup_min_lr to the maximum by γ. k = -1 (before the
// first step) gives warmup_min_lr. An unset warmup_max_lr is the optimizer's lr for WarmupLR, but
// 0.001 for WarmupDecayLR, whose own signature in DeepSpeed has that default.
constexpr double kWarmupDecayDefaultMaxLr = 0.001;
double warmup_lr(const SchedulerConfig& c, double base_lr, int64_t k) {
  double gamma = 0.0;
  if (k >= warmup_steps(c)) {
    gamma = c.type == SchedulerType::kWarmupDecayLR ? decay_gamma(c, k) : 1.0;
  } else if (k >= 0) {
    gamma = warmup_gamma(c, k);
  }
  const double fallback = c.type == SchedulerType::kWarmupDecayLR ? kWarmupDecayDefaultMaxLr : base_lr;
  const double max_lr = c.warmup_max_lr.value_or(fallback);
  return c.warmup_min_lr + (max_lr - c.warmup_min_lr) * gamma;
}

// WarmupCosineLR's factor on the optimizer's lr for k >= 0: warmup from warmup_min_ratio to 1, then a
// half cosine from 1 down to cos_min_ratio, reached at k = T - 1 and kept from there on.
double cosine_ratio(const SchedulerConfig& c, int64_t k) {
  const int64_t n = warmup_steps(c);
  if (k < n) return c.warmup_min_ratio + warmup_gamma(c, k) * (1.0 - c.warmup_min_ratio);
  const int64_t decay_steps = std::max<int64_t>(1, c.total_num_steps - n);
  const double progress = std::min(1.0, static_cast<double>(k - n + 1) / static_cast<double>(decay_steps));
  const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
}

}  // namespace

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr) : config_(config), base_lr_(base_lr) {
  // DeepSpeed falls back to "log" (with a warning) for an unknown warmup_type; the config parser is the
  // place for that, so anything else reaching here is refused rather than silently reinterpreted.
  const bool warms_up = config_.type != SchedulerType::kNone;
  if (warms_up && config_.warmup_type != "log" && config_.warmup_type != "linear") {
    fail(ErrorKind::kInvalidInput,
         "scheduler warmup_type '" + config_.warmup_type + "' is not supported (expected 'log' or 'linear')");
  }
}

double LrSchedule::lr(int64_t k) const {
  switch (config_.type) {
    case SchedulerType::kNone:
      return base_lr_;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR:
      return warmup_lr(config_, base_lr_, k);
    case SchedulerType::kWarmupCosineLR:
      // Unlike WarmupLR, DeepSpeed's WarmupCosineLR gives lr 0 before its first step.
      return k < 0 ? 0.0 : base_lr_ * cosine_ratio(config_, k);
  }
  fail(ErrorKind::kInternal, "LrSchedule: unknown scheduler type " + std::to_string(static_cast<int>(config_.type)));
}

}  // namespace shardkit::trainer
