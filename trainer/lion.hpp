// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023), as DeepSpeed's "Lion"
// optimizer type configures it: one moment, and every element moves by the learning rate in the
// direction of the sign of an interpolation of moment and gradient.
//   g = grad * grad_multiplier
//   c = beta1 m + (1 - beta1) g
//   w = w * (1 - lr * weight_decay) - lr * sign(c)
//   m = beta2 m + (1 - beta2) g
// Weight decay is decoupled, and none for the elements of tensors the model says do not decay. sign(0)
// is 0, as in the paper and PyTorch's torch.sign: an element whose gradient and moment are both zero
// (padding, a token never seen) stays where it is. (DeepSpeed's fused kernel moves it by +lr.)
#pragma once

#include <cstdint>
#include <span>

#include "ckpt/tensor_table.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer {

// What the element-wise update uses (fp32, as every implementation computes it).
struct LionCoefficients {
  float beta1, beta2;
  float lr;
  float keep;  // 1 - lr * weight_decay
  float grad_multiplier;

  static LionCoefficients of(const OptimizerStep& step);
  bool decays() const noexcept { return keep != 1.0f; }
  // For the elements of tensors that do not decay.
  LionCoefficients without_decay() const noexcept {
    LionCoefficients c = *this;
    c.keep = 1.0f;
    return c;
  }
};

// One update of the flat arrays (equal lengths), as cpu_adamw (adamw.hpp) takes its arguments.
void cpu_lion(std::span<float> master, std::span<float> exp_avg, std::span<const float> grad, const LionCoefficients& c,
              NoDecayRanges no_decay = {}, ckpt::DType narrow = ckpt::DType::kF32, uint16_t* narrowed = nullptr);

// Lion's descriptor: states fp32, exp_avg.
const Optimizer& lion_optimizer();

}  // namespace shardkit::trainer
