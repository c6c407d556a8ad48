#include "trainer/cuda/optimizer_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

// One element of AdamW, the same expressions as trainer/adamw.cpp's CPU update: without decay or l2
// where `decays` is false.
template <typename T>
__device__ __forceinline__ void adamw_element(float& w, float& m, float& v, float grad, T* param, bool decays,
                                              const AdamWCoefficients& c) {
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

// One element of Lion, as trainer/lion.cpp's CPU update: no decay where `decays` is false.
template <typename T>
__device__ __forceinline__ void lion_element(float& w, float& m, float grad, T* param, bool decays,
                                             const LionCoefficients& c) {
  const float keep = decays ? c.keep : 1.0f;
  const float g = grad * c.grad_multiplier;
  const float u = c.beta1 * m + (1.0f - c.beta1) * g;
  const float sign = static_cast<float>((u > 0.0f) - (u < 0.0f));
  w = w * keep - c.lr * sign;
  m = c.beta2 * m + (1.0f - c.beta2) * g;
  if (param) *param = from_float<T>(w);
}

// The update kernels are memory-bound: each thread of one wave (gridDim x blockDim threads, all
// resident) walks packs of W adjacent elements, so that each of its loads moves 16 bytes and the no-decay
// table is bisected once per thread, not once per element. The `n % W` elements past the last pack, if
// any, are the first thread's.
template <int W>
struct PackWalk {
  int64_t first, stride, packed;
  __device__ explicit PackWalk(int64_t n)
      : first((blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * W),
        stride(int64_t{gridDim.x} * blockDim.x * W),
        packed(n / W * W) {}
  __device__ bool first_thread() const { return first == 0; }
};

template <int W, typename T>
__global__ void adamw_kernel(float* w, float* m, float* v, const float* grad, T* params, int64_t n, AdamWCoefficients c,
                             NoDecayRanges nd) {
  const PackWalk<W> walk(n);
  DecayCursor cursor(nd, nd.origin + walk.first);
  for (int64_t i = walk.first; i < walk.packed; i += walk.stride) {
    Vec<float, W> wv = load_vec<W>(w + i), mv = load_vec<W>(m + i), vv = load_vec<W>(v + i);
    const Vec<float, W> gv = load_vec<W>(grad + i);
    Vec<T, W> pv;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      adamw_element(wv.v[e], mv.v[e], vv.v[e], gv.v[e], &pv.v[e], cursor.decays(nd.origin + i + e), c);
    }
    store_vec(w + i, wv);
    store_vec(m + i, mv);
    store_vec(v + i, vv);
    if (params) store_vec(params + i, pv);
  }
  if (!walk.first_thread()) return;
  for (int64_t i = walk.packed; i < n; ++i) {  // the thread's positions still ascend
    adamw_element(w[i], m[i], v[i], grad[i], params ? params + i : nullptr, cursor.decays(nd.origin + i), c);
  }
}

template <int W, typename T>
__global__ void lion_kernel(float* w, float* m, const float* grad, T* params, int64_t n, LionCoefficients c,
                            NoDecayRanges nd) {
  const PackWalk<W> walk(n);
  DecayCursor cursor(nd, nd.origin + walk.first);
  for (int64_t i = walk.first; i < walk.packed; i += walk.stride) {
    Vec<float, W> wv = load_vec<W>(w + i), mv = load_vec<W>(m + i);
    const Vec<float, W> gv = load_vec<W>(grad + i);
    Vec<T, W> pv;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      lion_element(wv.v[e], mv.v[e], gv.v[e], &pv.v[e], cursor.decays(nd.origin + i + e), c);
    }
    store_vec(w + i, wv);
    store_vec(m + i, mv);
    if (params) store_vec(params + i, pv);
  }
  if (!walk.first_thread()) return;
  for (int64_t i = walk.packed; i < n; ++i) {
    lion_element(w[i], m[i], grad[i], params ? params + i : nullptr, cursor.decays(nd.origin + i), c);
  }
}

constexpr int kUpdateThreads = 256;

// Calls launch(std::integral_constant<int, W>{}) with W = 4 (16 bytes of fp32) where every fp32
// pointer is 16-byte aligned and `params` (null or) aligned to 4 of T, else with W = 1.
template <typename T, typename Launch>
void launch_packed(const T* params, std::initializer_list<const float*> states, Launch&& launch) {
  constexpr int kPack = 4;
  const bool aligned =
      std::ranges::all_of(states, [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }) &&
      reinterpret_cast<uintptr_t>(params) % (kPack * sizeof(T)) == 0;
  if (aligned) {
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
  if (n == 0) return;
  // Without weight decay every element takes the same update: the table is not read.
  if (!c.decays()) no_decay.count = 0;
  launch_packed(params, {master, exp_avg, exp_avg_sq, grad}, [&](auto pack) {
    const auto kernel = adamw_kernel<pack(), T>;
    const int blocks = resident_blocks_for(kernel, kUpdateThreads, (n + pack() - 1) / pack());
    kernel<<<blocks, kUpdateThreads, 0, st>>>(master, exp_avg, exp_avg_sq, grad, params, n, c, no_decay);
  });
}

template <typename T>
void lion(float* master, float* exp_avg, const float* grad, T* params, int64_t n, const LionCoefficients& c,
          NoDecayRanges no_decay, cudaStream_t st) {
  if (n == 0) return;
  if (!c.decays()) no_decay.count = 0;
  launch_packed(params, {master, exp_avg, grad}, [&](auto pack) {
    const auto kernel = lion_kernel<pack(), T>;
    const int blocks = resident_blocks_for(kernel, kUpdateThreads, (n + pack() - 1) / pack());
    kernel<<<blocks, kUpdateThreads, 0, st>>>(master, exp_avg, grad, params, n, c, no_decay);
  });
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
