#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/flash_attention.hpp"
#include "model/cuda/head_size.hpp"
#include "model/cuda/hopper_attention.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"

namespace shardkit::model::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// ------------------------------------------------------------------------------------------------
// Deterministic column sums

// The second step of the deterministic column sums (norm and bias gradients): out[c] += (or, not
// `add`, =) the sum of partial[0..rows)[c], the rows added in one fixed order. Block (32, 8) takes
// 32 columns; thread y adds rows y, y + 8, ... (a warp reads 32 adjacent floats of a row), then its 8
// sums are added in y order.
constexpr dim3 kColumnSumBlock(32, 8);
__global__ void column_sums_kernel(float* out, const float* partial, int rows, int cols, bool add) {
  __shared__ float sums[8][32];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += 8) acc += partial[int64_t{r} * cols + col];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0.0f;
  for (int y = 0; y < 8; ++y) total += sums[y][threadIdx.x];
  out[col] = add ? out[col] + total : total;
}

// ------------------------------------------------------------------------------------------------
// Bias, GELU, residual

template <typename T>
__global__ void bias_forward_kernel(T* out, const T* bias, int N, int OC) {
  const int64_t total = int64_t{N} * OC;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % OC]));
  }
}

// Column sums, deterministic: block (x, g) sums columns [x 32 V, (x + 1) 32 V) of rows
// [g R, (g + 1) R) into partial[g] -- a thread V adjacent columns with 16-byte loads (V values of T),
// so a warp reads 512 contiguous bytes of a row; its 8 row groups are added in shared memory in a
// fixed order. column_sums_kernel then adds the partials, again in a fixed order.
template <typename T>
__global__ void bias_partial_kernel(float* partial, const T* dout, int N, int OC, int R, bool vectorized) {
  constexpr int kVec = Vec<T>::kSize;
  __shared__ float sums[8][32 * kVec];
  const int col0 = (blockIdx.x * 32 + threadIdx.x) * kVec;
  const int begin = blockIdx.y * R, end = min(N, begin + R);
  float acc[kVec] = {};
  for (int row = begin + threadIdx.y; row < end; row += 8) {
    const T* src = dout + int64_t{row} * OC + col0;
    if (vectorized && col0 < OC) {
      const Vec<T> v = load_vec(src);
      for (int i = 0; i < kVec; ++i) acc[i] += to_float(v.v[i]);
    } else {
      for (int i = 0; i < kVec && col0 + i < OC; ++i) acc[i] += to_float(src[i]);
    }
  }
  for (int i = 0; i < kVec; ++i) sums[threadIdx.y][threadIdx.x * kVec + i] = acc[i];
  __syncthreads();
  for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * kVec; j += 256) {
    const int col = blockIdx.x * 32 * kVec + j;
    if (col >= OC) continue;
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += sums[y][j];
    partial[int64_t{blockIdx.y} * OC + col] = total;
  }
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = from_float<T>(grad * to_float(dout[i]));
  }
}

template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

// ------------------------------------------------------------------------------------------------
// Attention in fp32 (the exact path that follows the CPU reference; 16-bit types run on tensor cores,
// flash_attention.cu). Threads own rows: a query row in the forward and dq kernels, a key row in the
// dk/dv kernel. Tiles of the other side are staged in shared memory; scores never leave registers.

// Rows per tile: 64, or 32 for head size 128 (to stay within 48 KiB of static shared memory).
template <int HS>
constexpr int tile_rows() {
  return HS > 64 ? 32 : 64;
}

// Key and value row k0 + threadIdx.x of the kv head at k_base, v_base into shared memory, zeros past S.
template <typename T, int HS, int kRows>
__device__ __forceinline__ void stage_key_value(float (&ks)[kRows][HS + 1], float (&vs)[kRows][HS + 1], const T* k_base,
                                                const T* v_base, int k0, int S, int64_t ld) {
  const int kr = k0 + threadIdx.x;
  for (int i = 0; i < HS; ++i) {
    ks[threadIdx.x][i] = kr < S ? to_float(k_base[kr * ld + i]) : 0.0f;
    vs[threadIdx.x][i] = kr < S ? to_float(v_base[kr * ld + i]) : 0.0f;
  }
}

template <typename T, int HS>
__global__ void attention_forward_kernel(T* out, float* lse, const T* q_in, const T* k_in, const T* v_in,
                                         AttentionShape a, float scale) {
  constexpr int kTileRows = tile_rows<HS>();
  __shared__ float ks[kTileRows][HS + 1];
  __shared__ float vs[kTileRows][HS + 1];
  const int S = a.S, NH = a.NH, C = NH * HS;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / a.NKV);
  const int q0 = blockIdx.x * kTileRows;
  const int t = q0 + threadIdx.x;
  const T* q_base = q_in + int64_t{b} * S * a.ld_q + h * HS;
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  float q[HS], o[HS];
  for (int i = 0; i < HS; ++i) {
    q[i] = t < S ? to_float(q_base[t * a.ld_q + i]) * scale : 0.0f;
    o[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  const int k_end = min(S, q0 + kTileRows);
  for (int k0 = 0; k0 < k_end; k0 += kTileRows) {
    __syncthreads();
    stage_key_value<T, HS, kTileRows>(ks, vs, k_in + kv_offset, v_in + kv_offset, k0, S, a.ld_kv);
    __syncthreads();
    if (t >= S) continue;
    const int count = min(kTileRows, t - k0 + 1);  // causal: keys k0 .. t
    if (count <= 0) continue;
    float s[kTileRows];
    float tile_max = -FLT_MAX;
    for (int j = 0; j < count; ++j) {
      float dot = 0.0f;
      for (int i = 0; i < HS; ++i) dot += q[i] * ks[j][i];
      s[j] = dot;
      tile_max = fmaxf(tile_max, dot);
    }
    const float m_new = fmaxf(m, tile_max);
    const float correction = __expf(m - m_new);
    l *= correction;
    for (int i = 0; i < HS; ++i) o[i] *= correction;
    for (int j = 0; j < count; ++j) {
      const float p = __expf(s[j] - m_new);
      l += p;
      for (int i = 0; i < HS; ++i) o[i] += p * vs[j][i];
    }
    m = m_new;
  }
  if (t >= S) return;
  T* dst = out + (int64_t{b} * S + t) * C + h * HS;
  const float inv = 1.0f / l;
  for (int i = 0; i < HS; ++i) dst[i] = from_float<T>(o[i] * inv);
  lse[(int64_t{b} * NH + h) * S + t] = m + __logf(l);
}

// delta[b, h, t] = sum_i dout[t, i] * out[t, i] over the head's channels (one warp per row).
template <typename T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int B, int S, int C, int NH) {
  const int HS = C / NH;
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;  // over B*NH*S
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{B} * NH * S) return;
  const int t = static_cast<int>(row % S);
  const int h = static_cast<int>((row / S) % NH);
  const int b = static_cast<int>(row / (int64_t{S} * NH));
  const int64_t off = (int64_t{b} * S + t) * C + h * HS;
  float sum = 0.0f;
  for (int i = lane; i < HS; i += 32) sum += to_float(dout[off + i]) * to_float(out[off + i]);
  sum = warp_sum(sum);
  if (lane == 0) delta[row] = sum;
}

// dq: a thread per query row; key/value tiles in shared memory.
template <typename T, int HS>
__global__ void attention_dq_kernel(T* dq_out, const T* dout, const T* q_in, const T* k_in, const T* v_in,
                                    const float* lse, const float* delta, AttentionShape a, float scale) {
  constexpr int kTileRows = tile_rows<HS>();
  __shared__ float ks[kTileRows][HS + 1];
  __shared__ float vs[kTileRows][HS + 1];
  const int S = a.S, NH = a.NH, C = NH * HS;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / a.NKV);
  const int q0 = blockIdx.x * kTileRows;
  const int t = q0 + threadIdx.x;
  const T* q_base = q_in + int64_t{b} * S * a.ld_q + h * HS;
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  float q[HS], d[HS], dq[HS];
  const int64_t orow = (int64_t{b} * S + t) * C + h * HS;
  for (int i = 0; i < HS; ++i) {
    q[i] = t < S ? to_float(q_base[t * a.ld_q + i]) * scale : 0.0f;
    d[i] = t < S ? to_float(dout[orow + i]) : 0.0f;
    dq[i] = 0.0f;
  }
  const int64_t stat = (int64_t{b} * NH + h) * S + t;
  const float row_lse = t < S ? lse[stat] : 0.0f;
  const float row_delta = t < S ? delta[stat] : 0.0f;
  const int k_end = min(S, q0 + kTileRows);
  for (int k0 = 0; k0 < k_end; k0 += kTileRows) {
    __syncthreads();
    stage_key_value<T, HS, kTileRows>(ks, vs, k_in + kv_offset, v_in + kv_offset, k0, S, a.ld_kv);
    __syncthreads();
    if (t >= S) continue;
    const int count = min(kTileRows, t - k0 + 1);
    for (int j = 0; j < count; ++j) {
      float s = 0.0f, dp = 0.0f;
      for (int i = 0; i < HS; ++i) {
        s += q[i] * ks[j][i];
        dp += d[i] * vs[j][i];
      }
      const float ds = __expf(s - row_lse) * (dp - row_delta);
      for (int i = 0; i < HS; ++i) dq[i] += ds * ks[j][i];
    }
  }
  if (t >= S) return;
  T* dst = dq_out + int64_t{b} * S * a.ld_q + t * a.ld_q + h * HS;
  for (int i = 0; i < HS; ++i) dst[i] = from_float<T>(dq[i] * scale);
}

// dk, dv: a thread per key row of a kv head (kept in registers); query tiles of each of the heads
// that read it, in head order, in shared memory -- the group's sum without atomics.
template <typename T, int HS>
__global__ void attention_dkv_kernel(T* dk_out, T* dv_out, const T* dout, const T* q_in, const T* k_in, const T* v_in,
                                     const float* lse, const float* delta, AttentionShape a, float scale) {
  constexpr int kTileRows = tile_rows<HS>();
  __shared__ float qs[kTileRows][HS + 1];
  __shared__ float ds_[kTileRows][HS + 1];
  __shared__ float stats[kTileRows][2];
  const int S = a.S, NH = a.NH, C = NH * HS, group = NH / a.NKV;
  const int b = blockIdx.y / a.NKV, kvh = blockIdx.y % a.NKV;
  const int k0 = blockIdx.x * kTileRows;
  const int u = k0 + threadIdx.x;
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  float k[HS], v[HS], dk[HS], dv[HS];
  for (int i = 0; i < HS; ++i) {
    k[i] = u < S ? to_float(k_in[kv_offset + u * a.ld_kv + i]) : 0.0f;
    v[i] = u < S ? to_float(v_in[kv_offset + u * a.ld_kv + i]) : 0.0f;
    dk[i] = dv[i] = 0.0f;
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const T* q_base = q_in + int64_t{b} * S * a.ld_q + h * HS;
    for (int q0 = k0; q0 < S; q0 += kTileRows) {  // causal: queries t >= u
      __syncthreads();
      const int tr = q0 + threadIdx.x;
      const int64_t orow = (int64_t{b} * S + tr) * C + h * HS;
      for (int i = 0; i < HS; ++i) {
        qs[threadIdx.x][i] = tr < S ? to_float(q_base[tr * a.ld_q + i]) * scale : 0.0f;
        ds_[threadIdx.x][i] = tr < S ? to_float(dout[orow + i]) : 0.0f;
      }
      const int64_t stat = (int64_t{b} * NH + h) * S + tr;
      stats[threadIdx.x][0] = tr < S ? lse[stat] : 0.0f;
      stats[threadIdx.x][1] = tr < S ? delta[stat] : 0.0f;
      __syncthreads();
      if (u >= S) continue;
      const int first = max(0, u - q0);
      const int last = min(kTileRows, S - q0);
      for (int j = first; j < last; ++j) {
        float s = 0.0f, dp = 0.0f;
        for (int i = 0; i < HS; ++i) {
          s += qs[j][i] * k[i];
          dp += ds_[j][i] * v[i];
        }
        const float p = __expf(s - stats[j][0]);
        const float dscore = p * (dp - stats[j][1]);
        for (int i = 0; i < HS; ++i) {
          dv[i] += p * ds_[j][i];
          dk[i] += dscore * qs[j][i];  // qs holds scale * q: this is scale * dscore * q
        }
      }
    }
  }
  if (u >= S) return;
  for (int i = 0; i < HS; ++i) {
    dk_out[kv_offset + u * a.ld_kv + i] = from_float<T>(dk[i]);
    dv_out[kv_offset + u * a.ld_kv + i] = from_float<T>(dv[i]);
  }
}

// ------------------------------------------------------------------------------------------------
// Softmax cross-entropy, one block per row. Where two blocks' rows fit an SM's shared memory (bf16
// up to about 56 k entries: GPT-2's and Llama's vocabularies), the row is read from global memory
// once into shared memory and the gradient written from there: one read and one write of the logits.
// Otherwise two passes over the logits in global memory: an online maximum and sum (16-byte loads),
// then the gradient written in place; the second pass's reads come mostly from DRAM again, a wave of
// rows and the gradients written behind them being more than L2 keeps.

// (m, s) represents s * exp(m): merging two such partial sums.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// Merges a pack of logits into (m, s): its own maximum and sum first, then the merge.
template <typename T>
__device__ __forceinline__ void merge_pack(float& m, float& s, const Vec<T>& xv) {
  float vm = -FLT_MAX;
  for (int i = 0; i < Vec<T>::kSize; ++i) vm = fmaxf(vm, to_float(xv.v[i]));
  float vs = 0.0f;
  for (int i = 0; i < Vec<T>::kSize; ++i) vs += __expf(to_float(xv.v[i]) - vm);
  merge_max_sum(m, s, vm, vs);
}

// f(pack, v) for each 16-byte pack of a row's first `full` elements (v: the pack's first), each
// thread's packs in order. Bound by the loads' latency: each thread issues kAhead of its loads before
// it hands any on.
template <typename T, typename F>
__device__ __forceinline__ void for_each_pack(const T* x, int full, F&& f) {
  constexpr int kVec = Vec<T>::kSize, kAhead = 4;
  const int step = blockDim.x * kVec;
  int v = threadIdx.x * kVec;
  for (; v + (kAhead - 1) * step < full; v += kAhead * step) {
    Vec<T> xv[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) xv[u] = load_vec(x + v + u * step);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) f(xv[u], v + u * step);
  }
  for (; v < full; v += step) f(load_vec(x + v), v);
}

// The gradient of a row's loss, (softmax - onehot(target)) * dscale, into `out` from the row's logits
// in `in` (the row itself, or a copy of it in shared memory), 16 bytes at a time up to the ragged tail.
template <typename T>
__device__ __forceinline__ void write_xent_gradient(T* out, const T* in, int V, int target, float lse, float dscale) {
  constexpr int kVec = Vec<T>::kSize;
  const int full = V / kVec * kVec;
  for (int v = threadIdx.x * kVec; v < full; v += blockDim.x * kVec) {
    Vec<T> xv = load_vec(in + v);
    for (int i = 0; i < kVec; ++i) {
      const float p = __expf(to_float(xv.v[i]) - lse);
      xv.v[i] = from_float<T>((p - (v + i == target ? 1.0f : 0.0f)) * dscale);
    }
    store_vec(out + v, xv);
  }
  for (int v = full + threadIdx.x; v < V; v += blockDim.x) {
    const float p = __expf(to_float(in[v]) - lse);
    out[v] = from_float<T>((p - (v == target ? 1.0f : 0.0f)) * dscale);
  }
}

template <typename T>
__global__ void softmax_xent_kernel(T* logits, int64_t ld, float* losses, const int32_t* targets, int V, float dscale,
                                    bool backward) {
  constexpr int kVec = Vec<T>::kSize;
  __shared__ float shared_m[32], shared_s[32];
  T* x = logits + blockIdx.x * ld;
  const int full = V / kVec * kVec;  // rows start 16-byte aligned (ld is a multiple of the vector size)
  float m = -FLT_MAX, s = 0.0f;
  for_each_pack(x, full, [&](const Vec<T>& xv, int) { merge_pack(m, s, xv); });
  for (int v = full + threadIdx.x; v < V; v += blockDim.x) merge_max_sum(m, s, to_float(x[v]), 1.0f);
  for (int o = 16; o > 0; o >>= 1) {
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
  if (threadIdx.x % 32 == 0) {
    shared_m[threadIdx.x / 32] = m;
    shared_s[threadIdx.x / 32] = s;
  }
  __syncthreads();
  m = shared_m[0];
  s = shared_s[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) merge_max_sum(m, s, shared_m[w], shared_s[w]);
  const float lse = m + __logf(s);
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_float(x[target]);
  __syncthreads();  // the target logit is read before it is overwritten
  if (backward) write_xent_gradient(x, x, V, target, lse, dscale);
}

// The block's maximum (kMax) or sum of one float a thread, in an order fixed by the block's shape;
// every thread gets the same bits. `scratch` holds a float per warp; the barrier before returning lets
// the caller use it again, and publishes whatever the block wrote to shared memory before the call.
template <bool kMax>
__device__ float block_reduce(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();
  return x;
}

constexpr int kXentRowThreads = 512;

// The row in shared memory (dynamic, V elements): loaded with its maximum on the way, then the sum of
// exp(x - max), then the gradient from the shared copy. Two blocks an SM, so that one loads while the
// other computes.
template <typename T>
__global__ void __launch_bounds__(kXentRowThreads, 2)
    softmax_xent_row_kernel(T* logits, int64_t ld, float* losses, const int32_t* targets, int V, float dscale,
                            bool backward) {
  extern __shared__ __align__(16) unsigned char shared_row[];
  __shared__ float scratch[32];
  constexpr int kVec = Vec<T>::kSize;
  T* row = reinterpret_cast<T*>(shared_row);
  T* x = logits + blockIdx.x * ld;
  const int full = V / kVec * kVec;  // rows start 16-byte aligned (ld is a multiple of the vector size)
  const int step = blockDim.x * kVec;
  float m = -FLT_MAX;
  for_each_pack(x, full, [&](const Vec<T>& xv, int v) {
    store_vec(row + v, xv);
    for (int i = 0; i < kVec; ++i) m = fmaxf(m, to_float(xv.v[i]));
  });
  for (int t = full + threadIdx.x; t < V; t += blockDim.x) {
    row[t] = x[t];
    m = fmaxf(m, to_float(row[t]));
  }
  m = block_reduce<true>(m, scratch);
  float s = 0.0f;
  for (int t = threadIdx.x * kVec; t < full; t += step) {
    const Vec<T> xv = load_vec(row + t);
    for (int i = 0; i < kVec; ++i) s += __expf(to_float(xv.v[i]) - m);
  }
  for (int t = full + threadIdx.x; t < V; t += blockDim.x) s += __expf(to_float(row[t]) - m);
  s = block_reduce<false>(s, scratch);
  const float lse = m + __logf(s);
  const int target = targets[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_float(row[target]);
  if (backward) write_xent_gradient(x, row, V, target, lse, dscale);
}

// Whether softmax_xent_row_kernel<T> runs two blocks an SM with `bytes` of row each. Asked at every
// launch of a step no CUDA graph replays, so each device is configured once (the kernel's dynamic
// shared memory limit raised to all a block may have, the L1 given to shared memory, so that the
// launch configures what the occupancy count assumes) and each row size's answer kept.
template <typename T>
bool xent_rows_fit(size_t bytes) {
  static std::mutex mutex;
  static std::map<int, size_t> limit;                  // device -> largest dynamic shared memory a block
  static std::map<std::pair<int, size_t>, bool> fits;  // (device, bytes) -> two blocks an SM
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = fits.find({device, bytes}); it != fits.end()) return it->second;
  const auto kernel = softmax_xent_row_kernel<T>;
  auto known = limit.find(device);
  if (known == limit.end()) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const int dynamic = optin - static_cast<int>(attributes.sharedSizeBytes);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    known = limit.emplace(device, static_cast<size_t>(dynamic)).first;
  }
  int blocks = 0;
  if (bytes <= known->second)
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kXentRowThreads, bytes));
  return fits.emplace(std::make_pair(device, bytes), blocks >= 2).first->second;
}

// ------------------------------------------------------------------------------------------------
// Casts, reductions, read-back

__global__ void read_back_kernel(double* host, const double* device, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) host[i] = device[i];
}

__global__ void spin_kernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

template <typename T>
__global__ void cast_kernel(T* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = from_float<T>(in[i]);
  }
}

// The sum of v over a block of 256 threads in a fixed order (shuffles, then the warps in order); the
// result is valid in thread 0.
__device__ double block_sum_256(double v) {
  __shared__ double warp_sums[8];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < 8; ++w) total += warp_sums[w];
  }
  return total;
}

// Sums in double, deterministic: the threads of the first kernel's grid stride over x and block b adds
// its threads' sums into partials[b]; one block then adds the partials in a fixed tree. No atomics:
// every run gives the same bits (the gradient norm decides the clipping factor, so it must not wobble).
// The first kernel is bound by its loads (a gradient norm reads every gradient once): where x is
// 16-byte aligned a thread adds packs of 4 floats, two packs in flight, then the elements past the
// last pack one at a time.
template <bool kSquares>
__device__ __forceinline__ void add_pack(double& sum, const Vec<float, 4>& x) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const double v = x.v[i];
    sum += kSquares ? v * v : v;
  }
}

template <bool kSquares>
__global__ void sum_partials_kernel(double* partials, const float* x, int64_t n, bool packed) {
  const int64_t thread = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, threads = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = packed ? n / 4 : 0;
  double sum = 0.0;
  for (int64_t p = thread; p < packs; p += 2 * threads) {
    const Vec<float, 4> a = load_vec<4>(x + 4 * p);
    const bool second = p + threads < packs;
    const Vec<float, 4> b = second ? load_vec<4>(x + 4 * (p + threads)) : Vec<float, 4>{};
    add_pack<kSquares>(sum, a);
    if (second) add_pack<kSquares>(sum, b);
  }
  for (int64_t i = 4 * packs + thread; i < n; i += threads) {
    const double v = x[i];
    sum += kSquares ? v * v : v;
  }
  const double total = block_sum_256(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_final_kernel(double* out, const double* partials, int count) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  const double total = block_sum_256(sum);
  if (threadIdx.x == 0) *out = total;
}

template <bool kSquares>
void deterministic_sum(double* out, const float* x, int64_t n, cudaStream_t st) {
  const int blocks = std::max(1, std::min(blocks_for(n, 256), kSumBlocks));
  const bool packed = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  sum_partials_kernel<kSquares><<<blocks, 256, 0, st>>>(out + 1, x, n, packed);
  check_launch();
  sum_final_kernel<<<1, 256, 0, st>>>(out, out + 1, blocks);
  check_launch();
}

template <typename T, int HS>
void attention_forward_hs(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a,
                          cudaStream_t st) {
  const dim3 grid((a.S + tile_rows<HS>() - 1) / tile_rows<HS>(), a.B * a.NH);
  attention_forward_kernel<T, HS><<<grid, tile_rows<HS>(), 0, st>>>(out, lse, q, k, v, a, 1.0f / sqrtf(float(HS)));
  check_launch();
}

template <typename T>
void attention_delta(float* delta, const T* dout, const T* out, int B, int S, int C, int NH, cudaStream_t st) {
  const int64_t rows = int64_t{B} * NH * S;
  attention_delta_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, st>>>(delta, dout, out, B, S, C, NH);
  check_launch();
}

template <typename T, int HS>
void attention_backward_hs(T* dq, T* dk, T* dv, const float* delta, const T* dout, const T* q, const T* k, const T* v,
                           const float* lse, const AttentionShape& a, cudaStream_t st) {
  const int row_blocks = (a.S + tile_rows<HS>() - 1) / tile_rows<HS>();
  const float scale = 1.0f / sqrtf(float(HS));
  attention_dq_kernel<T, HS>
      <<<dim3(row_blocks, a.B * a.NH), tile_rows<HS>(), 0, st>>>(dq, dout, q, k, v, lse, delta, a, scale);
  check_launch();
  attention_dkv_kernel<T, HS>
      <<<dim3(row_blocks, a.B * a.NKV), tile_rows<HS>(), 0, st>>>(dk, dv, dout, q, k, v, lse, delta, a, scale);
  check_launch();
}

// The kernels' grids and head indexing assume these.
void check_attention_shape(const AttentionShape& a) {
  if (a.B < 1 || a.S < 1 || a.NH < 1 || a.NKV < 1 || a.NH % a.NKV != 0 || a.ld_q < int64_t{a.NH} * a.HS ||
      a.ld_kv < int64_t{a.NKV} * a.HS) {
    fail(ErrorKind::kInternal, "attention: invalid shape B " + std::to_string(a.B) + " S " + std::to_string(a.S) +
                                   " NH " + std::to_string(a.NH) + " NKV " + std::to_string(a.NKV) + " HS " +
                                   std::to_string(a.HS));
  }
}

}  // namespace

template <typename T>
void bias_forward(T* out, const T* bias, int N, int OC, cudaStream_t st) {
  bias_forward_kernel<<<blocks_for(int64_t{N} * OC, 256), 256, 0, st>>>(out, bias, N, OC);
  check_launch();
}

template <typename T>
void bias_backward(float* dbias, const T* dout, int N, int OC, float* scratch, GradWrite write, cudaStream_t st) {
  if (OC == 0) return;
  if (N == 0) return add_column_sums(dbias, scratch, 0, OC, write, st);  // no rows: 0 stored, or nothing added
  constexpr int kVec = Vec<T>::kSize;
  const bool vectorized = OC % kVec == 0 && reinterpret_cast<uintptr_t>(dout) % 16 == 0;
  const int rows = (N + kBiasBlocks - 1) / kBiasBlocks;
  const int blocks = (N + rows - 1) / rows;
  const dim3 grid((OC + 32 * kVec - 1) / (32 * kVec), blocks);
  bias_partial_kernel<<<grid, dim3(32, 8), 0, st>>>(scratch, dout, N, OC, rows, vectorized);
  check_launch();
  add_column_sums(dbias, scratch, blocks, OC, write, st);
}

void add_column_sums(float* out, const float* partial, int rows, int cols, GradWrite write, cudaStream_t st) {
  if (cols == 0) return;
  column_sums_kernel<<<(cols + 31) / 32, kColumnSumBlock, 0, st>>>(out, partial, rows, cols, write == GradWrite::kAdd);
  check_launch();
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t st) {
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, st>>>(out, inp, n);
  check_launch();
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t st) {
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, st>>>(dinp, inp, dout, n);
  check_launch();
}

template <typename T>
void add_inplace(T* y, const T* x, int64_t n, cudaStream_t st) {
  residual_kernel<<<blocks_for(n, 256), 256, 0, st>>>(y, y, x, n);
  check_launch();
}

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a,
                       cudaStream_t st) {
  check_attention_shape(a);
  if constexpr (std::is_same_v<T, float>) {
    with_head_size(a.HS, [&](auto hs) { attention_forward_hs<T, hs()>(out, lse, q, k, v, a, st); });
  } else if (use_hopper_attention(attention_kernels(), a, q, k, v, nullptr)) {
    hopper_attention_forward(out, lse, q, k, v, a, st);
  } else {
    flash_attention_forward(out, lse, q, k, v, a, st);
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                        const T* v, const float* lse, const AttentionShape& a, cudaStream_t st) {
  check_attention_shape(a);
  if constexpr (std::is_same_v<T, float>) {
    attention_delta(delta, dout, out, a.B, a.S, a.NH * a.HS, a.NH, st);
    with_head_size(a.HS,
                   [&](auto hs) { attention_backward_hs<T, hs()>(dq, dk, dv, delta, dout, q, k, v, lse, a, st); });
  } else if (use_hopper_attention(attention_kernels(), a, q, k, v, dout)) {
    hopper_attention_backward(dq, dk, dv, delta, dout, out, q, k, v, lse, a, st);
  } else {
    flash_attention_backward(dq, dk, dv, delta, dout, out, q, k, v, lse, a, st);
  }
}

template <typename T>
void softmax_cross_entropy(T* logits, int64_t ld, float* losses, const int32_t* targets, int rows, int V, float dscale,
                           bool backward, cudaStream_t st) {
  if (rows == 0) return;
  if (ld % Vec<T>::kSize != 0)
    fail(ErrorKind::kInternal, "softmax_cross_entropy: row stride not a multiple of 16 bytes");
  const size_t bytes = (sizeof(T) * static_cast<size_t>(V) + 15) / 16 * 16;
  if (xent_rows_fit<T>(bytes)) {
    softmax_xent_row_kernel<<<rows, kXentRowThreads, bytes, st>>>(logits, ld, losses, targets, V, dscale, backward);
  } else {
    softmax_xent_kernel<<<rows, 1024, 0, st>>>(logits, ld, losses, targets, V, dscale, backward);
  }
  check_launch();
}

template <typename T>
void cast_from_float(T* out, const float* in, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  cast_kernel<<<blocks_for(n, 256), 256, 0, st>>>(out, in, n);
  check_launch();
}

void sum_squares(double* out, const float* x, int64_t n, cudaStream_t st) {
  deterministic_sum<true>(out, x, n, st);
}

void sum_floats(double* out, const float* x, int64_t n, cudaStream_t st) {
  deterministic_sum<false>(out, x, n, st);
}

void read_back(double* host, const double* device, int n, cudaStream_t st) {
  if (n == 0) return;
  read_back_kernel<<<1, 32, 0, st>>>(host, device, n);
  check_launch();
}

void delay_stream(cudaStream_t st, double ms) {
  spin_kernel<<<1, 1, 0, st>>>(static_cast<uint64_t>(ms * 1e6));
  check_launch();
}

#define SHARDKIT_INSTANTIATE(T)                                                                                      \
  template void bias_forward<T>(T*, const T*, int, int, cudaStream_t);                                               \
  template void bias_backward<T>(float*, const T*, int, int, float*, GradWrite, cudaStream_t);                       \
  template void gelu_forward<T>(T*, const T*, int64_t, cudaStream_t);                                                \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                                     \
  template void add_inplace<T>(T*, const T*, int64_t, cudaStream_t);                                                 \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, const AttentionShape&, cudaStream_t); \
  template void attention_backward<T>(T*, T*, T*, float*, const T*, const T*, const T*, const T*, const T*,          \
                                      const float*, const AttentionShape&, cudaStream_t);                            \
  template void softmax_cross_entropy<T>(T*, int64_t, float*, const int32_t*, int, int, float, bool, cudaStream_t);  \
  template void cast_from_float<T>(T*, const float*, int64_t, cudaStream_t);

SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::cuda
