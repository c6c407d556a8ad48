#include "trainer/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "base/vector_clones.hpp"
#include "ckpt/shard_format.hpp"
#include "trainer/update_blocks.hpp"

namespace shardkit::trainer {
namespace {

// The element-wise update, at the machine's vector width (this file is compiled without fused
// multiply-adds and without errno for std::sqrt, which would otherwise keep the loop scalar:
// trainer/CMakeLists.txt).
SHARDKIT_VECTOR_CLONES void update_block(float* __restrict w, float* __restrict m, float* __restrict v,
                                         const float* __restrict grad, int64_t n, AdamWCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1, one_minus_beta2 = 1.0f - c.beta2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * c.grad_multiplier + c.l2 * w[i];
    const float mi = c.beta1 * m[i] + one_minus_beta1 * g;
    const float vi = c.beta2 * v[i] + one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    float wi = w[i] - c.decay * w[i];
    wi -= c.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
  }
}

}  // namespace

AdamWCoefficients AdamWCoefficients::of(const OptimizerStep& s) {
  const double bc1 = s.bias_correction ? 1.0 - std::pow(s.beta1, static_cast<double>(s.step)) : 1.0;
  const double bc2 = s.bias_correction ? 1.0 - std::pow(s.beta2, static_cast<double>(s.step)) : 1.0;
  AdamWCoefficients c{};
  c.beta1 = static_cast<float>(s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.eps = static_cast<float>(s.eps);
  c.step_size = static_cast<float>(s.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.grad_multiplier = static_cast<float>(s.grad_multiplier);
  c.decay = s.adam_w_mode ? static_cast<float>(s.lr) * static_cast<float>(s.weight_decay) : 0.0f;
  c.l2 = s.adam_w_mode ? 0.0f : static_cast<float>(s.weight_decay);
  return c;
}

void cpu_adamw(std::span<float> master, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<const float> grad, const AdamWCoefficients& c, NoDecayRanges no_decay, ckpt::DType narrow,
               uint16_t* narrowed) {
  const AdamWCoefficients plain = c.without_decay();
  update_in_blocks(master, no_decay, c.decays(), narrow, narrowed, [&](int64_t at, int64_t count, bool decays) {
    update_block(master.data() + at, exp_avg.data() + at, exp_avg_sq.data() + at, grad.data() + at, count,
                 decays ? c : plain);
  });
}

const Optimizer& adamw_optimizer() {
  static const Optimizer optimizer{OptimizerKind::kAdamW,
                                   "AdamW",
                                   {ckpt::kAdamWStates.begin(), ckpt::kAdamWStates.end()},
                                   [](const OptimizerStep& step, const UpdateChunk& u) {
                                     cpu_adamw(u.states[0], u.states[1], u.states[2], u.grad,
                                               AdamWCoefficients::of(step), u.no_decay, u.narrow, u.narrowed);
                                   }};
  return optimizer;
}

}  // namespace shardkit::trainer
