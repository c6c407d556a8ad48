// Initial values drawn on the device, where the states live: the same bits as trainer::init_values on
// the host (trainer/init.hpp), without a host buffer of the whole partition or a copy of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/init.hpp"

namespace shardkit::trainer::cuda {

// out[0, n) = elements [offset, offset + n) of the initial values of a tensor that draws `draw`.
void draw_init_values(float* out, int64_t n, const InitDraw& draw, uint64_t seed, int64_t offset, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
