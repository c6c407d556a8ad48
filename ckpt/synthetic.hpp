// Synthetic checkpoint content for benchmarks and tests: a transformer-like tensor table of a
// requested size, and values that are a pure function of (seed, tensor, state, element), so that any
// world size and stage produce the same logical checkpoint.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/layout.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit::ckpt {

// A table of ~`elements` elements: blocks of weight matrices, odd-sized biases and a tiny tensor, so
// that tensors straddle ranks and some are smaller than the world size.
TensorTable synthetic_table(int64_t elements);

// The value of element `element` of `tensor` in state `state`: uniform in [-1, 1).
float synthetic_value(uint64_t seed, int tensor, int state, int64_t element) noexcept;

// Fills `rank`'s flat buffer of `state` (layout.flat_size() elements) with synthetic values; padding
// stays zero.
void fill_synthetic(const Layout& layout, int rank, uint64_t seed, int state, std::span<float> flat);

}  // namespace shardkit::ckpt
