// Parameter initialisation keyed by (seed, tensor name, element index) with a counter-based RNG, so
// that the same weights come out for any world size, stage, number of threads and order of evaluation,
// on the host and on a GPU alike (trainer/philox.hpp). What each tensor draws (zeros, ones, a normal
// distribution and its deviation) is its family's InitRule.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/init_rule.hpp"
#include "trainer/philox.hpp"

namespace shardkit::model {
class Model;
}

namespace shardkit::trainer {

// What one tensor's elements are drawn from: its rule and the random stream its name keys.
struct InitDraw {
  model::InitRule::Kind kind = model::InitRule::kZeros;
  float std = 0;
  uint64_t stream = 0;
};

// The initial values of a whole model: a backend draws them where its states live.
struct RandomInit {
  uint64_t seed = 0;
  std::vector<InitDraw> tensors;  // by table index

  RandomInit(const model::Model& model, uint64_t random_seed);
};

// Element `index` of a tensor that draws `draw`.
SHARDKIT_HOST_DEVICE inline float init_value(const InitDraw& draw, uint64_t seed, uint64_t index) {
  if (draw.kind == model::InitRule::kNormal) {
    const float z = Philox::normal(seed, index, draw.stream);
#if defined(__CUDA_ARCH__)
    return __fmul_rn(draw.std, z);
#else
    return draw.std * z;
#endif
  }
  return draw.kind == model::InitRule::kOnes ? 1.0f : 0.0f;
}

// Writes elements [offset, offset + out.size()) of tensor `tensor`'s initial values, on the compute
// threads (model::cpu::set_compute_threads); the values do not depend on their number.
void init_values(const RandomInit& init, int tensor, int64_t offset, std::span<float> out);

}  // namespace shardkit::trainer
