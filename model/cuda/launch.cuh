// What every kernel file needs around its launches: a grid size for a grid-stride loop, the launch
// check, and the warp's sum.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::model::cuda {

// Blocks of `threads` for n elements, capped where a grid-stride loop does the rest.
inline int blocks_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 16));
}

inline void check_launch() {
  CUDA_CHECK(cudaGetLastError());
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace shardkit::model::cuda
