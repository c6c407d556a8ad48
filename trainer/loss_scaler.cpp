// DeepSpeed's loss scaler, DeepSpeed 0.19 semantics: the dynamic fp16 scaler with
// hysteresis, a static scale for fp16.loss_scale > 0 and for bf16, and a disabled scaler for fp32.
#include "trainer/loss_scaler.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>
#include <string>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::trainer {
namespace {

// Shortest readable form of a scale for messages (65536, 0.5).
std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void bad_config(const std::string& what) {
  fail(ErrorKind::kInvalidInput, "fp16 config: " + what);
}

// The dynamic scaler's parameters must keep update() well defined: a window of 0 would divide by zero,
// a hysteresis of 0 would never shrink the scale, and a scale that is 0, negative or infinite would
// scale the loss into nonsense.
void check_dynamic_config(const Fp16Config& fp16) {
  if (fp16.loss_scale_window < 1) {
    bad_config("loss_scale_window " + std::to_string(fp16.loss_scale_window) + " must be >= 1");
  }
  if (fp16.hysteresis < 1) bad_config("hysteresis " + std::to_string(fp16.hysteresis) + " must be >= 1");
  if (!std::isfinite(fp16.min_loss_scale) || fp16.min_loss_scale <= 0) {
    bad_config("min_loss_scale " + number_text(fp16.min_loss_scale) + " must be finite and > 0");
  }
  const double initial_scale = std::ldexp(1.0, fp16.initial_scale_power);
  if (!std::isfinite(initial_scale) || initial_scale <= 0) {
    bad_config("initial_scale_power " + std::to_string(fp16.initial_scale_power) + " gives no finite scale > 0");
  }
}

[[noreturn]] void bad_state(const std::string& where, const std::string& what) {
  fail(ErrorKind::kCorrupt, where + ": loss scaler state: " + what);
}

const nlohmann::json& state_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) bad_state(where, std::string("'") + key + "' is missing");
  return *it;
}

// An integer field within [lo, hi]; JSON floats (even 3.0) are refused, as to_json writes integers.
int64_t integer_field(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  return integer_field(j, key, where + ": loss scaler state", lo, hi, ErrorKind::kCorrupt);
}

double scale_field(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json& v = state_field(j, "cur_scale", where);
  if (!v.is_number()) bad_state(where, "'cur_scale' is not a number");
  const double scale = v.get<double>();
  if (!std::isfinite(scale) || scale <= 0)
    bad_state(where, "'cur_scale' = " + number_text(scale) + " is not finite and > 0");
  return scale;
}

}  // namespace

LossScaler::LossScaler(const Fp16Config& fp16, bool bf16) {
  if (fp16.enabled && bf16) fail(ErrorKind::kInvalidInput, "fp16 and bf16 cannot both be enabled");
  if (fp16.enabled && !(fp16.loss_scale >= 0 && std::isfinite(fp16.loss_scale))) {
    bad_config("loss_scale " + number_text(fp16.loss_scale) + " must be 0 (dynamic) or a finite static scale > 0");
  }
  checks_overflow_ = fp16.enabled || bf16;
  if (fp16.enabled && fp16.loss_scale == 0) {
    check_dynamic_config(fp16);
    dynamic_ = true;
    scale_window_ = fp16.loss_scale_window;
    min_scale_ = fp16.min_loss_scale;
    delayed_shift_ = fp16.hysteresis;
    consecutive_hysteresis_ = fp16.consecutive_hysteresis;
    state_.cur_scale = std::ldexp(1.0, fp16.initial_scale_power);
    state_.cur_hysteresis = delayed_shift_;
  } else if (fp16.enabled) {
    state_.cur_scale = fp16.loss_scale;
  }
  // bf16 and fp32 keep the default state: scale 1.
}

void LossScaler::update(bool overflow) {
  if (dynamic_ && overflow) {
    // Hysteresis: the scale shrinks only once delayed_shift overflows have used up cur_hysteresis.
    if (delayed_shift_ == 1 || state_.cur_hysteresis == 1) {
      if (state_.cur_scale == min_scale_) {
        fail(ErrorKind::kInternal, "loss scale already at its minimum (" + number_text(min_scale_) +
                                       ") and the gradients still overflow: training cannot continue");
      }
      state_.cur_scale = std::max(state_.cur_scale / scale_factor_, min_scale_);
    } else {
      state_.cur_hysteresis -= 1;
    }
    state_.last_overflow_iter = state_.cur_iter;
  } else if (dynamic_) {
    if (consecutive_hysteresis_) state_.cur_hysteresis = delayed_shift_;
    // Clean updates between the last overflow and this one. DeepSpeed 0.19 grows the scale when that
    // count is a positive multiple of the window: first on the (window+1)-th clean update, then every
    // window updates (0.16 grew one update earlier).
    const int64_t clean_before = state_.cur_iter - state_.last_overflow_iter - 1;
    if (clean_before > 0 && clean_before % scale_window_ == 0) {
      if (!consecutive_hysteresis_) state_.cur_hysteresis = delayed_shift_;
      state_.cur_scale *= scale_factor_;
    }
  }
  state_.cur_iter += 1;
}

nlohmann::json LossScaler::to_json() const {
  return {{"cur_scale", state_.cur_scale},
          {"cur_iter", state_.cur_iter},
          {"last_overflow_iter", state_.last_overflow_iter},
          {"cur_hysteresis", state_.cur_hysteresis}};
}

void LossScaler::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) bad_state(where, "expected a JSON object");
  // Ranges are the invariants update() keeps: the last overflow happened before the current iteration
  // (or never: -1), and hysteresis never drops below 1.
  LossScalerState state;
  state.cur_scale = scale_field(j, where);
  state.cur_iter = integer_field(j, "cur_iter", 0, INT64_MAX, where);
  state.last_overflow_iter = integer_field(j, "last_overflow_iter", -1, state.cur_iter - 1, where);
  state.cur_hysteresis = static_cast<int>(integer_field(j, "cur_hysteresis", 1, INT_MAX, where));
  state_ = state;
}

}  // namespace shardkit::trainer
