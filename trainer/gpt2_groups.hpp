// The parameter groups of GPT-2, one definition for the CPU model, the GPU model and the benchmarks:
// the embeddings (wte, wpe), each transformer block, the final LayerNorm -- what the passes acquire
// and release together, whose gradients complete together, and so the unit of ZeRO-3's gathers and
// of the gradient buckets. Indices follow model::gpt2_tensor_table.
#pragma once

#include <vector>

#include "model/gpt2_config.hpp"
#include "trainer/param_store.hpp"

namespace shardkit::trainer {

inline std::vector<TensorGroup> gpt2_groups(const model::GptConfig& config) {
  const int L = config.n_layer, first_block = 2;  // the blocks' tensors follow wte and wpe
  std::vector<TensorGroup> groups = {{0, first_block}};
  for (int l = 0; l < L; ++l) {
    groups.push_back({first_block + model::kTensorsPerBlock * l, first_block + model::kTensorsPerBlock * (l + 1)});
  }
  groups.push_back({first_block + model::kTensorsPerBlock * L, first_block + model::kTensorsPerBlock * L + 2});
  return groups;
}

}  // namespace shardkit::trainer
