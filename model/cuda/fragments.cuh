// Fragment arithmetic both tensor-core attention implementations share (flash_attention.cu on mma.sync,
// hopper_attention.cu on wgmma). Their fp32 accumulators have the same layout: a thread's [n][4] holds,
// with g = lane / 4 and t = lane % 4, row g at columns 8n + 2t, +1 ([n][0], [n][1]) and row g + 8 at the
// same columns ([n][2], [n][3]) of its warp's 16 rows, each row spread over the four lanes of a quad.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "model/cuda/exp2_poly.hpp"

namespace shardkit::model::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Two floats rounded (to nearest even) into one register of two 16-bit values, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The two 16-bit values of a register as floats (the low half first).
template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}
template <>
__device__ __forceinline__ float2 unpack<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// 2^x on the special-function unit, results below 2^-126 flushed to zero. exp2f keeps such results
// exact at the price of a compare and two predicated multiplies a call; the softmax makes one call a
// score, on the pipe that bounds the forward pass at head size 64, and a probability that small adds
// nothing an fp32 sum can hold (each row's largest is 1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// f(std::true_type) for a tile that crosses the causal diagonal (some of its scores are masked), else
// f(std::false_type): the mask's compares and selects are compiled only into the diagonal tiles' code.
template <typename F>
__device__ __forceinline__ void with_causal_mask(bool diagonal, F&& f) {
  if (diagonal) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// The A fragments (16 x K, for the next product) of an fp32 accumulator tile (16 x K), rounded to T
// in pairs: columns 8n.. are the low (n even) or high half of k16 step n / 2.
template <typename T, int K>
__device__ __forceinline__ void to_fragments(uint32_t (&p)[K / 16][4], const float (&x)[K / 8][4]) {
#pragma unroll
  for (int n = 0; n < K / 8; ++n) {
    p[n / 2][(n % 2) * 2] = pack<T>(x[n][0], x[n][1]);
    p[n / 2][(n % 2) * 2 + 1] = pack<T>(x[n][2], x[n][3]);
  }
}

// The online softmax of FlashAttention over a thread's two rows (row0, row0 + 8), a key tile at a
// time: the running maximum m in raw score units (the scale is positive, so it commutes with the
// maximum, and folds into the exponent's FFMA) and the running sum l of exp(scale * s - scale * m).
struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // The factors that move what was accumulated under the previous maximum to the new one.
  struct Rescale {
    float c[2];
    template <int O8>
    __device__ __forceinline__ void apply(float (&o)[O8][4]) const {
#pragma unroll
      for (int n = 0; n < O8; ++n) {
        o[n][0] *= c[0];
        o[n][1] *= c[0];
        o[n][2] *= c[1];
        o[n][3] *= c[1];
      }
    }
  };

  // Scores s (16 x 8 N8, raw, keys k0.. in columns) become probabilities under the new running
  // maximum, and the running sum is moved to it and grows by them; with kMasked, keys after the row
  // (key > row) get probability 0. The output accumulated so far is the caller's to rescale (the
  // Hopper kernel does it once the product still adding to it has finished). With kPolyEvery = k > 0,
  // every k-th column group of an unmasked tile takes exp2_poly (the FMA pipe) instead of the
  // special-function unit.
  template <bool kMasked, int kPolyEvery = 0, int N8>
  __device__ __forceinline__ Rescale probabilities(float (&s)[N8][4], int k0, int row0, float scale_log2) {
    const int t = threadIdx.x % 4;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < N8; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (kMasked) {
          const int key = k0 + n * 8 + 2 * t + i;
          if (key > row0) s[n][i] = -INFINITY;
          if (key > row0 + 8) s[n][2 + i] = -INFINITY;
        }
        mx[0] = fmaxf(mx[0], s[n][i]);
        mx[1] = fmaxf(mx[1], s[n][2 + i]);
      }
    }
    Rescale rescale;
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], quad_max(mx[r]));
      rescale.c[r] = exp2_ftz((m[r] - mn) * scale_log2);
      m[r] = mn;
      ms[r] = mn * scale_log2;
      l[r] *= rescale.c[r];
    }
    constexpr int kEvery = kMasked || kPolyEvery <= 0 ? N8 + 1 : kPolyEvery;  // N8 + 1: none
#pragma unroll
    for (int n = 0; n < N8; ++n) {
      const bool poly = n % kEvery == kEvery - 1;  // a constant once unrolled: one of the two is compiled
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float x0 = fmaf(s[n][i], scale_log2, -ms[0]), x1 = fmaf(s[n][2 + i], scale_log2, -ms[1]);
        s[n][i] = poly ? exp2_poly(x0) : exp2_ftz(x0);
        s[n][2 + i] = poly ? exp2_poly(x1) : exp2_ftz(x1);
        l[0] += s[n][i];
        l[1] += s[n][2 + i];
      }
    }
    return rescale;
  }

  // probabilities() and the output o rescaled at once.
  template <bool kMasked, int N8, int O8>
  __device__ __forceinline__ void tile(float (&s)[N8][4], float (&o)[O8][4], int k0, int row0, float scale_log2) {
    probabilities<kMasked>(s, k0, row0, scale_log2).apply(o);
  }

  // After the last tile: the sums over the quad's columns.
  __device__ __forceinline__ void finish() {
    l[0] = quad_sum(l[0]);
    l[1] = quad_sum(l[1]);
  }
  // lse (natural log) of the two rows into row_lse, rows at or past S skipped.
  __device__ __forceinline__ void store_lse(float* row_lse, int row0, int S, float scale_log2) const {
    if (row0 < S) row_lse[row0] = (m[0] * scale_log2 + log2f(l[0])) * kLn2;
    if (row0 + 8 < S) row_lse[row0 + 8] = (m[1] * scale_log2 + log2f(l[1])) * kLn2;
  }
};

// The backward pass on a tile of a query row block (dq), in two steps so that the second can wait for
// dP: scores s (raw; keys k0.. in columns) become P = exp2(scale_log2 * s - lse) with each row's lse
// in log2 units (with kMasked, keys after the row get 0), then P becomes dS = P o (dP - delta).
template <bool kMasked, int N8>
__device__ __forceinline__ void query_tile_probabilities(float (&s)[N8][4], int k0, int row0, const float (&lse)[2],
                                                         float scale_log2) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float p0 = exp2_ftz(fmaf(s[n][i], scale_log2, -lse[0]));
      float p1 = exp2_ftz(fmaf(s[n][2 + i], scale_log2, -lse[1]));
      if constexpr (kMasked) {
        const int key = k0 + n * 8 + 2 * t + i;
        if (key > row0) p0 = 0.0f;
        if (key > row0 + 8) p1 = 0.0f;
      }
      s[n][i] = p0;
      s[n][2 + i] = p1;
    }
  }
}
template <int N8>
__device__ __forceinline__ void query_tile_ds_from_p(float (&p)[N8][4], const float (&dp)[N8][4],
                                                     const float (&delta)[2]) {
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      p[n][i] *= dp[n][i] - delta[0];
      p[n][2 + i] *= dp[n][2 + i] - delta[1];
    }
  }
}
template <bool kMasked, int N8>
__device__ __forceinline__ void query_tile_ds(float (&s)[N8][4], const float (&dp)[N8][4], int k0, int row0,
                                              const float (&lse)[2], const float (&delta)[2], float scale_log2) {
  query_tile_probabilities<kMasked>(s, k0, row0, lse, scale_log2);
  query_tile_ds_from_p(s, dp, delta);
}

// The same on a tile of a key row block (dk, dv), transposed: a thread's rows are keys (key0, key0 + 8)
// and its columns queries q0.., each query's lse (log2 units) and delta read from lse_s and delta_s;
// pt (scores) becomes P^T (with kMasked, queries before the key get 0), then dpt (dP^T) becomes dS^T.
template <bool kMasked, int N8>
__device__ __forceinline__ void key_tile_probabilities(float (&pt)[N8][4], int q0, int key0, const float* lse_s,
                                                       float scale_log2) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int col = n * 8 + 2 * t + i;
      float p0 = exp2_ftz(fmaf(pt[n][i], scale_log2, -lse_s[col]));
      float p1 = exp2_ftz(fmaf(pt[n][2 + i], scale_log2, -lse_s[col]));
      if constexpr (kMasked) {
        if (q0 + col < key0) p0 = 0.0f;
        if (q0 + col < key0 + 8) p1 = 0.0f;
      }
      pt[n][i] = p0;
      pt[n][2 + i] = p1;
    }
  }
}
template <int N8>
__device__ __forceinline__ void key_tile_ds_from_p(float (&dpt)[N8][4], const float (&pt)[N8][4],
                                                   const float* delta_s) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int col = n * 8 + 2 * t + i;
      dpt[n][i] = pt[n][i] * (dpt[n][i] - delta_s[col]);
      dpt[n][2 + i] = pt[n][2 + i] * (dpt[n][2 + i] - delta_s[col]);
    }
  }
}
template <bool kMasked, int N8>
__device__ __forceinline__ void key_tile_ds(float (&pt)[N8][4], float (&dpt)[N8][4], int q0, int key0,
                                            const float* lse_s, const float* delta_s, float scale_log2) {
  key_tile_probabilities<kMasked>(pt, q0, key0, lse_s, scale_log2);
  key_tile_ds_from_p(dpt, pt, delta_s);
}

// Writes acc (16 x HS) * (scale0 for row0, scale1 for row0 + 8) to rows of a row-major matrix.
template <typename T, int HS>
__device__ __forceinline__ void store_rows(T* dst, const float (&acc)[HS / 8][4], int row0, int S, int64_t ld,
                                           float scale0, float scale1) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < HS / 8; ++n) {
    const int c = n * 8 + 2 * t;
    if (row0 < S) *reinterpret_cast<uint32_t*>(dst + row0 * ld + c) = pack<T>(acc[n][0] * scale0, acc[n][1] * scale0);
    if (row0 + 8 < S) {
      *reinterpret_cast<uint32_t*>(dst + (row0 + 8) * ld + c) = pack<T>(acc[n][2] * scale1, acc[n][3] * scale1);
    }
  }
}

}  // namespace shardkit::model::cuda
