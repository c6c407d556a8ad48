#include "trainer/cuda/optimizer_kernels.hpp"

#include <cstdint>

#include "base/error.hpp"

#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"

namespace shardkit::trainer::cuda {
namespace {

using model::cuda::blocks_for;
using model::cuda::check_launch;
using model::cuda::from_float;

// Walks the sorted ranges of `nd` along a thread's ascending view positions: a thread finds its place
// in the (small, cached) table once by bisection and then only steps forward -- a warp's 32 neighbours
// read the same entries. One launch updates the whole view, whatever the number of tensors.
class DecayCursor {
 public:
  __device__ DecayCursor(const NoDecayRanges& nd, int64_t first) : nd_(nd) {
    int64_t lo = 0, hi = nd.count;
    while (lo < hi) {  // the first range that ends after `first`
      const int64_t mid = lo + (hi - lo) / 2;
      if (nd.ranges[mid].end <= first) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    r_ = lo;
    skip_ = r_ < nd.count ? nd.ranges[r_] : kPastTheEnd;
  }
  // Whether view position `at` (not below the previous one asked) decays.
  __device__ bool decays(int64_t at) {
    while (skip_.end <= at) skip_ = ++r_ < nd_.count ? nd_.ranges[r_] : kPastTheEnd;
    return at < skip_.begin;
  }

 private:
  static constexpr ElementRange kPastTheEnd{INT64_MAX, INT64_MAX};
  NoDecayRanges nd_;
  int64_t r_;
  ElementRange skip_;
};

// The same update as trainer/adamw.cpp's CPU version, element for element: the elements of `nd`'s
// ranges with decay and l2 zero.
template <typename T>
__global__ void adamw_kernel(float* w, float* m, float* v, const float* grad, T* params, int64_t n, AdamWCoefficients c,
                             NoDecayRanges nd) {
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  DecayCursor cursor(nd, nd.origin + i);
  for (; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const bool decays = cursor.decays(nd.origin + i);
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

// The same update as trainer/lion.cpp's CPU version, element for element: no decay on `nd`'s ranges.
template <typename T>
__global__ void lion_kernel(float* w, float* m, const float* grad, T* params, int64_t n, LionCoefficients c,
                            NoDecayRanges nd) {
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  DecayCursor cursor(nd, nd.origin + i);
  for (; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float keep = cursor.decays(nd.origin + i) ? c.keep : 1.0f;
    const float g = grad[i] * c.grad_multiplier;
    const float u = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    const float sign = static_cast<float>((u > 0.0f) - (u < 0.0f));
    const float wi = w[i] * keep - c.lr * sign;
    m[i] = c.beta2 * m[i] + (1.0f - c.beta2) * g;
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

template <typename T>
void lion(float* master, float* exp_avg, const float* grad, T* params, int64_t n, const LionCoefficients& c,
          NoDecayRanges no_decay, cudaStream_t st) {
  if (n == 0) return;
  if (!c.decays()) no_decay.count = 0;
  lion_kernel<<<blocks_for(n, 256), 256, 0, st>>>(master, exp_avg, grad, params, n, c, no_decay);
  check_launch();
}

template <typename T>
void optimizer_update(const OptimizerStep& step, std::span<float* const> states, const float* grad, T* params,
                      int64_t n, NoDecayRanges no_decay, cudaStream_t st) {
  switch (step.kind) {
    case OptimizerKind::kAdamW:
      return adamw(states[0], states[1], states[2], grad, params, n, AdamWCoefficients::of(step), no_decay, st);
    case OptimizerKind::kLion:
      return lion(states[0], states[1], grad, params, n, LionCoefficients::of(step), no_decay, st);
  }
  fail(ErrorKind::kInternal, "an optimizer without a GPU update");
}

#define SHARDKIT_INSTANTIATE(T)                                                                                      \
  template void adamw<T>(float*, float*, float*, const float*, T*, int64_t, const AdamWCoefficients&, NoDecayRanges, \
                         cudaStream_t);                                                                              \
  template void lion<T>(float*, float*, const float*, T*, int64_t, const LionCoefficients&, NoDecayRanges,           \
                        cudaStream_t);                                                                               \
  template void optimizer_update<T>(const OptimizerStep&, std::span<float* const>, const float*, T*, int64_t,        \
                                    NoDecayRanges, cudaStream_t);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::trainer::cuda
