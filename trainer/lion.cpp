#include "trainer/lion.hpp"

#include "base/vector_clones.hpp"
#include "ckpt/shard_format.hpp"
#include "trainer/update_blocks.hpp"

namespace shardkit::trainer {
namespace {

// The element-wise update, at the machine's vector width (without fused multiply-adds:
// trainer/CMakeLists.txt).
SHARDKIT_VECTOR_CLONES void update_block(float* __restrict w, float* __restrict m, const float* __restrict grad,
                                         int64_t n, LionCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1, one_minus_beta2 = 1.0f - c.beta2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * c.grad_multiplier;
    const float u = c.beta1 * m[i] + one_minus_beta1 * g;
    const float sign = static_cast<float>((u > 0.0f) - (u < 0.0f));
    w[i] = w[i] * c.keep - c.lr * sign;
    m[i] = c.beta2 * m[i] + one_minus_beta2 * g;
  }
}

}  // namespace

LionCoefficients LionCoefficients::of(const OptimizerStep& s) {
  LionCoefficients c{};
  c.beta1 = static_cast<float>(s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.lr = static_cast<float>(s.lr);
  c.keep = static_cast<float>(1.0 - s.lr * s.weight_decay);
  c.grad_multiplier = static_cast<float>(s.grad_multiplier);
  return c;
}

void cpu_lion(std::span<float> master, std::span<float> exp_avg, std::span<const float> grad, const LionCoefficients& c,
              NoDecayRanges no_decay, ckpt::DType narrow, uint16_t* narrowed) {
  const LionCoefficients plain = c.without_decay();
  update_in_blocks(master, no_decay, c.decays(), narrow, narrowed, [&](int64_t at, int64_t count, bool decays) {
    update_block(master.data() + at, exp_avg.data() + at, grad.data() + at, count, decays ? c : plain);
  });
}

const Optimizer& lion_optimizer() {
  static const Optimizer optimizer{OptimizerKind::kLion,
                                   "Lion",
                                   {ckpt::kMasterWeights, ckpt::kExpAvg},
                                   [](const OptimizerStep& step, const UpdateChunk& u) {
                                     cpu_lion(u.states[0], u.states[1], u.grad, LionCoefficients::of(step), u.no_decay,
                                              u.narrow, u.narrowed);
                                   }};
  return optimizer;
}

}  // namespace shardkit::trainer
