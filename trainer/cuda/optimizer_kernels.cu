#include "trainer/cuda/optimizer_kernels.hpp"

#include <cstdint>

#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"

namespace shardkit::trainer::cuda {
namespace {

using model::cuda::blocks_for;
using model::cuda::check_launch;
using model::cuda::from_float;

// The index of the first of the sorted ranges that ends after view position `at` (count if none).
__device__ int64_t first_range_ending_after(const NoDecayRanges& nd, int64_t at) {
  int64_t lo = 0, hi = nd.count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (nd.ranges[mid].end <= at) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The same update as trainer/adamw.cpp's CPU version, element for element: the elements of `nd`'s
// ranges with decay and l2 zero. One launch for the whole view, whatever the number of tensors: a
// thread's positions ascend, so its place in the (small, cached) table is found once by bisection
// and then only steps forward -- a warp's 32 neighbours read the same entries.
template <typename T>
__global__ void adamw_kernel(float* w, float* m, float* v, const float* grad, T* params, int64_t n, AdamWCoefficients c,
                             NoDecayRanges nd) {
  constexpr ElementRange kPastTheEnd{INT64_MAX, INT64_MAX};
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  int64_t r = first_range_ending_after(nd, nd.origin + i);
  ElementRange skip = r < nd.count ? nd.ranges[r] : kPastTheEnd;
  for (; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = nd.origin + i;
    while (skip.end <= at) skip = ++r < nd.count ? nd.ranges[r] : kPastTheEnd;
    const bool decays = at < skip.begin;
    const float decay = decays ? c.decay : 0.0f, l2 = decays ? c.l2 : 0.0f;
    const float g = grad[i] * c.grad_multiplier + l2 * w[i];
    const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const float denom = sqrtf(vi) * c.inv_sqrt_bc2 + c.eps;
    float wi = w[i] - decay * w[i];
    wi -= c.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (params) params[i] = from_float<T>(wi);
  }
}

}  // namespace

template <typename T>
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, T* params, int64_t n,
           const AdamWCoefficients& c, NoDecayRanges no_decay, cudaStream_t st) {
  if (n == 0) return;
  // Without weight decay every element takes the same update: the table is not read.
  if (!c.decays()) no_decay.count = 0;
  adamw_kernel<<<blocks_for(n, 256), 256, 0, st>>>(master, exp_avg, exp_avg_sq, grad, params, n, c, no_decay);
  check_launch();
}

#define SHARDKIT_INSTANTIATE(T)                                                                                      \
  template void adamw<T>(float*, float*, float*, const float*, T*, int64_t, const AdamWCoefficients&, NoDecayRanges, \
                         cudaStream_t);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::trainer::cuda
