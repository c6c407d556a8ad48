// DeepSpeed's learning-rate schedulers WarmupLR, WarmupDecayLR and WarmupCosineLR, as functions of
// DeepSpeed's `last_batch_iteration` counter k. DeepSpeed sets k = -1 at construction and advances it
// once after every optimizer step that was not skipped; the optimizer step always uses lr(k) of the
// current k.
#pragma once

#include <cstdint>

#include "trainer/ds_config.hpp"

namespace shardkit::trainer {

class LrSchedule {
 public:
  // `base_lr`: the optimizer's lr (WarmupCosineLR scales it; WarmupLR uses it when warmup_max_lr is
  // unset, WarmupDecayLR then uses DeepSpeed's default 0.001). SchedulerType::kNone gives base_lr.
  LrSchedule(const SchedulerConfig& config, double base_lr);

  // Learning rate at last_batch_iteration = k (k >= -1).
  double lr(int64_t k) const;

 private:
  SchedulerConfig config_;
  double base_lr_;
};

}  // namespace shardkit::trainer
