// Parameter initialisation keyed by (seed, tensor name, element index) with a counter-based RNG, so
// that the same weights come out for any world size, stage and order of evaluation. Follows Hugging
// Face's GPT-2 initialisation: weights N(0, 0.02), the residual projections (c_proj.weight) N(0,
// 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1.
#pragma once

#include <cstdint>
#include <span>

#include "ckpt/tensor_table.hpp"
#include "model/gpt2_config.hpp"

namespace shardkit::trainer {

// Writes elements [offset, offset + out.size()) of `tensor`'s initial values.
void init_gpt2_values(const model::GptConfig& config, const ckpt::TensorInfo& tensor, uint64_t seed, int64_t offset,
                      std::span<float> out);

}  // namespace shardkit::trainer
