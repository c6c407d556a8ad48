// Parameter initialisation keyed by (seed, tensor name, element index) with a counter-based RNG, so
// that the same weights come out for any world size, stage and order of evaluation. What each tensor
// draws (zeros, ones, a normal distribution and its deviation) is its family's InitRule.
#pragma once

#include <cstdint>
#include <span>

#include "model/model.hpp"

namespace shardkit::trainer {

// Writes elements [offset, offset + out.size()) of tensor `tensor`'s initial values, on the compute
// threads (model::cpu::set_compute_threads); the values do not depend on their number.
void init_values(const model::Model& model, int tensor, uint64_t seed, int64_t offset, std::span<float> out);

}  // namespace shardkit::trainer
