// AdamW with DeepSpeed's semantics: the step's hyper-parameters, the per-step coefficients every
// implementation (CPU engine, GPU kernel, CPU offload) derives from them in one place, and the CPU
// update itself -- all threads, vectorised (AVX-512 / AVX2 chosen at run time on x86-64), optionally
// writing the updated weights rounded to bf16 or fp16 in the same pass, as ZeRO-Offload needs.
#pragma once

#include <cstdint>
#include <span>

#include "ckpt/tensor_table.hpp"

namespace shardkit::trainer {

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adam_w_mode = true;
  bool bias_correction = true;
  int64_t step = 1;            // 1-based count of optimizer steps taken, this one included
  double grad_multiplier = 1;  // applied to the summed gradients first (1 / (W * loss scale * clip))
};

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

  static AdamWCoefficients of(const AdamWStep& step);
  bool decays() const noexcept { return decay != 0.0f || l2 != 0.0f; }
  // For the elements of tensors that do not decay: both terms zero, the update otherwise the same.
  AdamWCoefficients without_decay() const noexcept {
    AdamWCoefficients c = *this;
    c.decay = 0.0f;
    c.l2 = 0.0f;
    return c;
  }
};

// Positions [begin, end) of an optimizer view.
struct ElementRange {
  int64_t begin = 0, end = 0;
};

// Where weight decay does not apply (weight_decay.hpp derives it from the model): `count` sorted,
// disjoint ranges of optimizer-view positions -- in host memory for cpu_adamw, device memory for the
// GPU kernel -- and the view position of the updated arrays' first element, so that an update of a
// chunk of the view passes the whole table, shifted with at(). The default: every element decays.
struct NoDecayRanges {
  const ElementRange* ranges = nullptr;
  int64_t count = 0;
  int64_t origin = 0;

  NoDecayRanges at(int64_t offset) const noexcept { return {ranges, count, origin + offset}; }
};

// One update of the flat arrays (equal lengths), without weight decay on the elements `no_decay`
// names. With `narrow` bf16 or fp16, `narrowed` (same length) receives the updated weights as its bit
// patterns, rounded to nearest even (fp32: nothing). Runs on the calling thread's OpenMP team (all threads of a
// parallel region it opens).
void cpu_adamw(std::span<float> master, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<const float> grad, const AdamWCoefficients& c, NoDecayRanges no_decay = {},
               ckpt::DType narrow = ckpt::DType::kF32, uint16_t* narrowed = nullptr);

// out = in rounded to bf16/fp16 bit patterns (nearest even), on all threads. fp32 copies nothing.
void narrow_weights(std::span<const float> in, ckpt::DType narrow, uint16_t* out);

}  // namespace shardkit::trainer
