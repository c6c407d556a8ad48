#include "trainer/cuda/optimizer_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "base/error.hpp"

#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"

namespace shardkit::trainer::cuda {
namespace {

using model::cuda::check_launch;
using model::cuda::from_float;
using model::cuda::load_vec;
using model::cuda::resident_blocks_for;
using model::cuda::store_vec;
using model::cuda::Vec;

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

// One element of AdamW, the same expressions as trainer/adamw.cpp's CPU update, on its states
// (master weight, exp_avg, exp_avg_sq): without decay or l2 where `decays` is false.
struct AdamWElement {
  static constexpr int kStates = 3;
  AdamWCoefficients c;
  template <typename T>
  __device__ __forceinline__ void operator()(float (&s)[kStates], float grad, T* param, bool decays) const {
    float &w = s[0], &m = s[1], &v = s[2];
    const float decay = decays ? c.decay : 0.0f, l2 = decays ? c.l2 : 0.0f;
    const float g = grad * c.grad_multiplier + l2 * w;
    m = c.beta1 * m + (1.0f - c.beta1) * g;
    v = c.beta2 * v + (1.0f - c.beta2) * g * g;
    const float denom = sqrtf(v) * c.inv_sqrt_bc2 + c.eps;
    float wi = w - decay * w;
    wi -= c.step_size * m / denom;
    w = wi;
    if (param) *param = from_float<T>(wi);
  }
};

// One element of Lion, as trainer/lion.cpp's CPU update, on (master weight, exp_avg): no decay where
// `decays` is false.
struct LionElement {
  static constexpr int kStates = 2;
  LionCoefficients c;
  template <typename T>
  __device__ __forceinline__ void operator()(float (&s)[kStates], float grad, T* param, bool decays) const {
    float &w = s[0], &m = s[1];
    const float keep = decays ? c.keep : 1.0f;
    const float g = grad * c.grad_multiplier;
    const float u = c.beta1 * m + (1.0f - c.beta1) * g;
    const float sign = static_cast<float>((u > 0.0f) - (u < 0.0f));
    w = w * keep - c.lr * sign;
    m = c.beta2 * m + (1.0f - c.beta2) * g;
    if (param) *param = from_float<T>(w);
  }
};

template <int N>
struct States {
  float* at[N];
};

// The update kernels are memory-bound: each thread of one wave (gridDim x blockDim threads, all
// resident) walks packs of W adjacent elements, so that each of its loads moves 16 bytes and the no-decay
// table is bisected once per thread, not once per element; `update` (an element of an optimizer) runs
// on each element's states in registers. The `n % W` elements past the last pack, if any, are the
// first thread's.
template <int W, typename T, typename Element>
__global__ void update_kernel(States<Element::kStates> states, const float* grad, T* params, int64_t n, Element update,
                              NoDecayRanges nd) {
  constexpr int kStates = Element::kStates;
  const int64_t first = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * W;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * W, packed = n / W * W;
  DecayCursor cursor(nd, nd.origin + first);
  for (int64_t i = first; i < packed; i += stride) {
    Vec<float, W> sv[kStates];
#pragma unroll
    for (int k = 0; k < kStates; ++k) sv[k] = load_vec<W>(states.at[k] + i);
    const Vec<float, W> gv = load_vec<W>(grad + i);
    Vec<T, W> pv;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      float s[kStates];
#pragma unroll
      for (int k = 0; k < kStates; ++k) s[k] = sv[k].v[e];
      update(s, gv.v[e], &pv.v[e], cursor.decays(nd.origin + i + e));
#pragma unroll
      for (int k = 0; k < kStates; ++k) sv[k].v[e] = s[k];
    }
#pragma unroll
    for (int k = 0; k < kStates; ++k) store_vec(states.at[k] + i, sv[k]);
    if (params) store_vec(params + i, pv);
  }
  if (first != 0) return;
  for (int64_t i = packed; i < n; ++i) {  // the first thread's positions still ascend
    float s[kStates];
    for (int k = 0; k < kStates; ++k) s[k] = states.at[k][i];
    update(s, grad[i], params ? params + i : nullptr, cursor.decays(nd.origin + i));
    for (int k = 0; k < kStates; ++k) states.at[k][i] = s[k];
  }
}

// Launches update_kernel over [0, n) with W = 4 (16 bytes of fp32) where every fp32 pointer is 16-byte
// aligned and `params` (null or) aligned to 4 of T, else with W = 1, in one wave of 256-thread blocks.
template <typename T, typename Element>
void launch_update(const Element& update, States<Element::kStates> states, const float* grad, T* params, int64_t n,
                   NoDecayRanges no_decay, cudaStream_t st) {
  if (n == 0) return;
  // Without weight decay every element takes the same update: the table is not read.
  if (!update.c.decays()) no_decay.count = 0;
  constexpr int kPack = 4, kThreads = 256;
  const auto aligned16 = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool packed = std::ranges::all_of(states.at, aligned16) && aligned16(grad) &&
                      reinterpret_cast<uintptr_t>(params) % (kPack * sizeof(T)) == 0;
  const auto launch = [&](auto pack) {
    const auto kernel = update_kernel<pack(), T, Element>;
    const int blocks = resident_blocks_for(kernel, kThreads, (n + pack() - 1) / pack());
    kernel<<<blocks, kThreads, 0, st>>>(states, grad, params, n, update, no_decay);
  };
  if (packed) {
    launch(std::integral_constant<int, kPack>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  check_launch();
}

}  // namespace

template <typename T>
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, T* params, int64_t n,
           const AdamWCoefficients& c, NoDecayRanges no_decay, cudaStream_t st) {
  launch_update(AdamWElement{c}, States<3>{{master, exp_avg, exp_avg_sq}}, grad, params, n, no_decay, st);
}

template <typename T>
void lion(float* master, float* exp_avg, const float* grad, T* params, int64_t n, const LionCoefficients& c,
          NoDecayRanges no_decay, cudaStream_t st) {
  launch_update(LionElement{c}, States<2>{{master, exp_avg}}, grad, params, n, no_decay, st);
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
