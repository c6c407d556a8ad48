// communication_data_type on CPU ranks. MPI sums fp32, so a reduction "in bf16" is emulated: the
// gradients are rounded to the wire type before the sum and the sum is rounded after it. For two ranks
// that is what NCCL's 16-bit reductions give on GPU ranks (one addition, in fp32, rounded); with more
// ranks NCCL also rounds between its hops, so the two differ by reduction-order noise.
#pragma once

#include <span>

#include "ckpt/tensor_table.hpp"

namespace shardkit::trainer {

// values = widen(narrow(values)) for a 16-bit `wire` (nearest even, on all threads); fp32: unchanged.
void round_to_wire(std::span<float> values, ckpt::DType wire);

}  // namespace shardkit::trainer
