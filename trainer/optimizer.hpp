// The optimizers shardkit trains with, each as one descriptor: the fp32 states it keeps per element of
// a rank's optimizer view (the master weights first, then its own, by their checkpoint names) and its
// update on the CPU threads. The engines, the offloaded optimizer, the memory figures and the
// checkpoints loop over `states`; the GPU update (trainer/cuda/optimizer_kernels.hpp) follows the kind.
// Adding one: its update in its own file (as adamw.* and lion.*, on update_blocks.hpp), a line in
// optimizers() and a case in the GPU update; docs/ARCHITECTURE.md has the checklist.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/tensor_table.hpp"

namespace shardkit::trainer {

enum class OptimizerKind { kAdamW, kLion };

// One optimizer step's hyper-parameters: DeepSpeed's optimizer.params (Lion reads lr, the betas and
// weight_decay), the step count and the multiplier of the summed gradients.
struct OptimizerStep {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adam_w_mode = true;  // AdamW: decoupled weight decay; false: Adam with L2 regularisation
  bool bias_correction = true;
  int64_t step = 1;            // 1-based count of optimizer steps taken, this one included
  double grad_multiplier = 1;  // applied to the summed gradients first (1 / (W * loss scale * clip))
};

// Positions [begin, end) of an optimizer view.
struct ElementRange {
  int64_t begin = 0, end = 0;
};

// Where weight decay does not apply (weight_decay.hpp derives it from the model): `count` sorted,
// disjoint ranges of optimizer-view positions -- in host memory for the CPU updates, device memory for
// the GPU kernels -- and the view position of the updated arrays' first element, so that an update of
// a chunk of the view passes the whole table, shifted with at(). The default: every element decays.
struct NoDecayRanges {
  const ElementRange* ranges = nullptr;
  int64_t count = 0;
  int64_t origin = 0;

  NoDecayRanges at(int64_t offset) const noexcept { return {ranges, count, origin + offset}; }
};

// What a CPU update changes: the states of a stretch of the optimizer view (in the descriptor's order,
// equal lengths), from its reduced gradients, without weight decay where `no_decay` says; with
// `narrow` bf16 or fp16, `narrowed` (same length) receives the updated weights as bit patterns,
// rounded to nearest even, in the same pass (fp32: nothing).
struct UpdateChunk {
  std::span<const std::span<float>> states;
  std::span<const float> grad;
  NoDecayRanges no_decay;
  ckpt::DType narrow = ckpt::DType::kF32;
  uint16_t* narrowed = nullptr;
};

struct Optimizer {
  OptimizerKind kind;
  std::string_view name;                 // as DeepSpeed's optimizer.type spells it
  std::vector<std::string_view> states;  // checkpoint names: the master weights first
  // The update, on the calling thread's OpenMP team.
  void (*cpu_update)(const OptimizerStep& step, const UpdateChunk& chunk);

  int num_states() const noexcept { return static_cast<int>(states.size()); }
  // Bytes of states a rank keeps per element of its optimizer view.
  int64_t state_bytes() const noexcept { return num_states() * int64_t{sizeof(float)}; }
  // `states` as a manifest's or a writer's list.
  std::vector<std::string> state_names() const { return {states.begin(), states.end()}; }
};

// Every optimizer, one line each (optimizer.cpp).
const std::vector<const Optimizer*>& optimizers();
const Optimizer& optimizer(OptimizerKind kind);

// out = in rounded to bf16/fp16 bit patterns (nearest even), on all threads. fp32 copies nothing.
void narrow_weights(std::span<const float> in, ckpt::DType narrow, uint16_t* out);

}  // namespace shardkit::trainer
