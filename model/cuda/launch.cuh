// What every kernel file needs around its launches: grid sizes for grid-stride loops, the launch
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

// Blocks of `threads` for n items, at most as many of `kernel`'s as the device runs at once: a
// grid-stride loop of one wave, with no blocks that start late and form a tail.
template <typename Kernel>
int resident_blocks_for(Kernel kernel, int threads, int64_t n) {
  int per_multiprocessor = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, threads, 0));
  const int64_t wave = int64_t{std::max(per_multiprocessor, 1)} * multiprocessors();
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, wave));
}

inline void check_launch() {
  CUDA_CHECK(cudaGetLastError());
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace shardkit::model::cuda
