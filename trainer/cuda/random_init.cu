#include "model/cuda/launch.cuh"
#include "trainer/cuda/random_init.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::blocks_for;
using model::cuda::check_launch;

namespace {

__global__ void draw_kernel(float* out, int64_t n, InitDraw draw, uint64_t seed, int64_t offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = init_value(draw, seed, static_cast<uint64_t>(offset + i));
  }
}

}  // namespace

void draw_init_values(float* out, int64_t n, const InitDraw& draw, uint64_t seed, int64_t offset, cudaStream_t st) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  draw_kernel<<<blocks_for(n, kThreads), kThreads, 0, st>>>(out, n, draw, seed, offset);
  check_launch();
}

}  // namespace shardkit::trainer::cuda
