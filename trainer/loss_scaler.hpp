// DeepSpeed's loss scaler (DeepSpeed 0.19 semantics): dynamic scaling for fp16
// with hysteresis, a static scale when fp16.loss_scale > 0, scale 1 for bf16 (overflow still skips
// the step), and nothing at all for fp32 training.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "trainer/ds_config.hpp"

namespace shardkit::trainer {

struct LossScalerState {
  double cur_scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;

  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  // From the config: fp16 enabled -> dynamic (loss_scale == 0) or static; bf16 -> static 1 with
  // overflow checks; neither -> disabled (scale 1, no overflow checks).
  LossScaler(const Fp16Config& fp16, bool bf16);

  double scale() const noexcept { return state_.cur_scale; }
  bool dynamic() const noexcept { return dynamic_; }
  // Whether gradients must be checked for inf/nan (and the step skipped on overflow).
  bool checks_overflow() const noexcept { return checks_overflow_; }

  // Called once per optimizer step, before the step, with whether the gradients overflowed.
  // Throws Error(kInternal) "loss scale already at minimum ..." when a dynamic scaler overflows at
  // its minimum scale (DeepSpeed's raise_error_at_min_scale).
  void update(bool overflow);

  const LossScalerState& state() const noexcept { return state_; }
  void set_state(const LossScalerState& state) noexcept { state_ = state; }

  nlohmann::json to_json() const;
  // Restores from to_json()'s form; Error(kCorrupt) naming `where` when malformed.
  void from_json(const nlohmann::json& j, const std::string& where);

 private:
  bool dynamic_ = false;
  bool checks_overflow_ = false;
  double scale_factor_ = 2.0;
  int64_t scale_window_ = 1000;
  double min_scale_ = 1.0;
  int delayed_shift_ = 1;
  bool consecutive_hysteresis_ = false;
  LossScalerState state_;
};

}  // namespace shardkit::trainer
