// AdamW (and Adam with L2 regularisation) with DeepSpeed's semantics: the per-step coefficients every
// implementation (CPU engine, GPU kernel, CPU offload) derives from the step in one place, the CPU
// update itself, and its descriptor (optimizer.hpp) -- all threads, vectorised (AVX-512 / AVX2 chosen at run time on
// x86-64), optionally writing the updated weights rounded to bf16 or fp16 in the same pass, as ZeRO-Offload needs.
#pragma once

#include <cstdint>
#include <span>

#include "ckpt/tensor_table.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer {

// What the element-wise update uses (fp32, as every implementation computes it):
//   g = grad * grad_multiplier + l2 * w
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w = w - decay * w - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// with decay = lr * weight_decay for AdamW (decoupled), l2 = weight_decay for Adam with L2 -- both 0
// for the elements of tensors the model says do not decay (Model::decays).
struct AdamWCoefficients {
  float beta1, beta2, eps;
  float step_size;     // lr / bias_correction1
  float inv_sqrt_bc2;  // 1 / sqrt(bias_correction2)
  float grad_multiplier;
  float decay;  // lr * weight_decay (AdamW), else 0
  float l2;     // weight_decay (Adam with L2 regularisation), else 0

  static AdamWCoefficients of(const OptimizerStep& step);
  bool decays() const noexcept { return decay != 0.0f || l2 != 0.0f; }
  // For the elements of tensors that do not decay: both terms zero, the update otherwise the same.
  AdamWCoefficients without_decay() const noexcept {
    AdamWCoefficients c = *this;
    c.decay = 0.0f;
    c.l2 = 0.0f;
    return c;
  }
};

// One update of the flat arrays (equal lengths), without weight decay on the elements `no_decay`
// names. With `narrow` bf16 or fp16, `narrowed` (same length) receives the updated weights as its bit
// patterns, rounded to nearest even (fp32: nothing). Runs on the calling thread's OpenMP team (all threads of a
// parallel region it opens).
void cpu_adamw(std::span<float> master, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<const float> grad, const AdamWCoefficients& c, NoDecayRanges no_decay = {},
               ckpt::DType narrow = ckpt::DType::kF32, uint16_t* narrowed = nullptr);

// AdamW's descriptor: states fp32, exp_avg, exp_avg_sq.
const Optimizer& adamw_optimizer();

}  // namespace shardkit::trainer
