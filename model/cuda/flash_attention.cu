#include <cstdint>
#include <string>
#include <type_traits>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/flash_attention.hpp"
#include "model/cuda/fragments.cuh"
#include "model/cuda/head_size.hpp"

namespace shardkit::model::cuda {
namespace {

// Padding (elements) of every shared-memory row: the 8 rows a fragment load touches then start in
// 8 different groups of 4 banks, so the loads are free of bank conflicts.
constexpr int kPad = 8;

// d += a * b on tensor cores (mma.sync.m16n8k16, fp32 accumulators). Fragment layouts (PTX ISA,
// "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4, two 16-bit values per
// register, the lower column/row in the low half:
//   a (16x16, row-major): a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                         a[2] = A[g][2t+8, +9]   a[3] = A[g+8][2t+8, +9]
//   b (16x8):             b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   d (16x8, fp32):       d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// So the d fragments of two neighbouring 8-column tiles, rounded to 16 bits, are exactly the a
// fragment of the next product: probabilities never leave registers.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Rows [r0, r0 + R) of a row-major matrix with leading dimension ld, HS columns, into shared memory
// dst[R][HS + kPad], asynchronously (cp.async, 16 bytes at a time, no trip through registers); rows
// at or past S are zero-filled, so padding never produces NaN. Complete after cp_async_wait and a
// barrier.
template <typename T, int R, int HS>
__device__ void load_rows_async(T* dst, const T* src, int r0, int S, int64_t ld) {
  constexpr int kVec = 8;
  for (int v = threadIdx.x; v < R * HS / kVec; v += blockDim.x) {
    const int r = v / (HS / kVec), c = (v % (HS / kVec)) * kVec;
    const bool valid = r0 + r < S;
    const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * (HS + kPad) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr),
                 "l"(valid ? src + (r0 + r) * ld + c : src), "r"(valid ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// A block's double-buffered walk over tiles [first, last): fetch(tile) queues the tile's copies into
// buffer tile % 2 (and commits them); body(tile) runs once the tile has landed for every thread, while
// the next one is on its way.
template <typename Fetch, typename Body>
__device__ __forceinline__ void for_each_tile(int first, int last, Fetch&& fetch, Body&& body) {
  if (first < last) fetch(first);
  for (int tile = first; tile < last; ++tile) {
    __syncthreads();  // every warp is done with the buffer the next fetch overwrites
    if (tile + 1 < last) {
      fetch(tile + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile has landed, for every thread
    body(tile);
  }
}

// The forward and dq kernels' walk over the key/value tiles of keys [0, key_end) of one kv head (k_base,
// v_base: its first key and value element, rows ld apart), double-buffered in k_tiles / v_tiles (2
// tiles each): body(k0, ks, vs) for each tile.
template <typename T, int HS, int kBk, typename Body>
__device__ __forceinline__ void for_each_kv_tile(T* k_tiles, T* v_tiles, const T* k_base, const T* v_base, int S,
                                                 int64_t ld, int key_end, Body&& body) {
  constexpr int kTile = kBk * (HS + kPad);
  const auto fetch = [&](int tile) {
    load_rows_async<T, kBk, HS>(k_tiles + (tile % 2) * kTile, k_base, tile * kBk, S, ld);
    load_rows_async<T, kBk, HS>(v_tiles + (tile % 2) * kTile, v_base, tile * kBk, S, ld);
    cp_async_commit();
  };
  for_each_tile(0, (key_end + kBk - 1) / kBk, fetch,
                [&](int tile) { body(tile * kBk, k_tiles + (tile % 2) * kTile, v_tiles + (tile % 2) * kTile); });
}

// The a fragments of rows (row0, row0 + 8) x HS columns of a row-major matrix in global memory; rows
// at or past S are zero.
template <typename T, int HS>
__device__ void load_a_fragments(uint32_t (&a)[HS / 16][4], const T* src, int row0, int S, int64_t ld) {
  const int t = threadIdx.x % 4;
  const T* r0 = src + row0 * ld;
  const T* r1 = src + (row0 + 8) * ld;
  for (int kk = 0; kk < HS / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    a[kk][0] = row0 < S ? ld32(r0 + c) : 0u;
    a[kk][1] = row0 + 8 < S ? ld32(r1 + c) : 0u;
    a[kk][2] = row0 < S ? ld32(r0 + c + 8) : 0u;
    a[kk][3] = row0 + 8 < S ? ld32(r1 + c + 8) : 0u;
  }
}

// Four 8x8 matrices of 16-bit values from shared memory (ldmatrix): lane i gives the address of row
// i % 8 of matrix i / 8 and receives, of matrix j in register j, row lane / 4, columns 2 (lane % 4) and
// +1 -- or with .trans, column lane / 4, rows 2 (lane % 4) and +1: the b fragment of mma.m16n8k16
// straight from a row-major tile, whichever way round the product needs it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// acc (16 x 8 N8 columns) = A (16 x HS, fragments) * B^T, where B is N8*8 rows x HS columns in shared
// memory (row stride HS + kPad). One ldmatrix gives b0, b1 of two 16-column steps of one 8-row tile.
template <typename T, int HS, int N8>
__device__ __forceinline__ void mma_abt(float (&acc)[N8][4], const uint32_t (&a)[HS / 16][4], const T* b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const T* row = b + (n * 8 + lane % 8) * (HS + kPad) + (lane / 8) * 8;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, row + kk * 16);
      mma<T>(acc[n], a[kk], r[0], r[1]);
      mma<T>(acc[n], a[kk + 1], r[2], r[3]);
    }
  }
}

// acc (16 x HS) += P (16 x K, as K/8 fp32 d fragments, rounded here) * B, where B (K x HS) is a
// row-major tile in shared memory (row stride HS + kPad). One transposing ldmatrix gives b0, b1 of
// two 8-column tiles of one 16-row step.
template <typename T, int HS, int K>
__device__ __forceinline__ void mma_pb(float (&acc)[HS / 8][4], const float (&p)[K / 8][4], const T* b) {
  const int lane = threadIdx.x % 32;
  const T* lane_row = b + ((lane / 8) % 2 * 8 + lane % 8) * (HS + kPad) + (lane / 16) * 8;
#pragma unroll
  for (int j = 0; j < K / 16; ++j) {
    const uint32_t a[4] = {pack<T>(p[2 * j][0], p[2 * j][1]), pack<T>(p[2 * j][2], p[2 * j][3]),
                           pack<T>(p[2 * j + 1][0], p[2 * j + 1][1]), pack<T>(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
    for (int n = 0; n < HS / 8; n += 2) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, lane_row + j * 16 * (HS + kPad) + n * 8);
      mma<T>(acc[n], a, r[0], r[1]);
      mma<T>(acc[n + 1], a, r[2], r[3]);
    }
  }
}

// Forward: a block owns kBq query rows of one (batch, head), a warp 16 of them; key/value tiles of kBk
// rows pass through shared memory.
template <typename T, int HS, int kBq, int kBk, int kMinBlocks>
__global__ void __launch_bounds__(kBq * 2, kMinBlocks)
    flash_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, AttentionShape a, float scale_log2) {
  constexpr int kTile = kBk * (HS + kPad);
  __shared__ __align__(16) T k_tiles[2 * kTile];  // double-buffered: the next tile loads during this one
  __shared__ __align__(16) T v_tiles[2 * kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int S = a.S, NH = a.NH, C = NH * HS;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / a.NKV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBq;  // the longest rows (most keys) start first
  const T* q_base = q + int64_t{b} * S * a.ld_q + h * HS;
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  const int row0 = q0 + warp * 16 + g;
  const int warp_last = q0 + warp * 16 + 15;
  uint32_t qa[HS / 16][4];
  load_a_fragments<T, HS>(qa, q_base, row0, S, a.ld_q);
  float o[HS / 8][4] = {};
  OnlineSoftmax softmax;
  auto tile = [&](int k0, const T* ks, const T* vs) {
    if (k0 > warp_last) return;  // every key of the tile follows every query of this warp
    float s[kBk / 8][4];
    mma_abt<T, HS, kBk / 8>(s, qa, ks);
    // Keys after the query are masked. The first tile (k0 = 0) always holds key 0, so every row's
    // running maximum is finite from then on.
    with_causal_mask(k0 + kBk - 1 > q0 + warp * 16,
                     [&](auto masked) { softmax.tile<masked()>(s, o, k0, row0, scale_log2); });
    mma_pb<T, HS, kBk>(o, s, vs);
  };
  for_each_kv_tile<T, HS, kBk>(k_tiles, v_tiles, k + kv_offset, v + kv_offset, S, a.ld_kv, min(S, q0 + kBq), tile);
  softmax.finish();
  store_rows<T, HS>(out + int64_t{b} * S * C + h * HS, o, row0, S, C, 1.0f / softmax.l[0], 1.0f / softmax.l[1]);
  if (t == 0) softmax.store_lse(lse + (int64_t{b} * NH + h) * S, row0, S, scale_log2);
}

// dq = scale * dS K with dS = P o (dO V^T - delta): a block owns kBq query rows, like the forward.
// delta = rowsum(dO o O) is computed here from the dO fragments the warp holds anyway, and written
// out for the dk/dv kernel.
template <typename T, int HS, int kBq, int kBk, int kMinBlocks>
__global__ void __launch_bounds__(kBq * 2, kMinBlocks)
    flash_dq_kernel(T* dq_out, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v,
                    const float* lse, AttentionShape a, float scale, float scale_log2) {
  constexpr int kTile = kBk * (HS + kPad);
  __shared__ __align__(16) T k_tiles[2 * kTile];
  __shared__ __align__(16) T v_tiles[2 * kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int S = a.S, NH = a.NH, C = NH * HS;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / a.NKV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBq;
  const int64_t q_offset = int64_t{b} * S * a.ld_q + h * HS;
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
  const int warp_last = q0 + warp * 16 + 15;
  uint32_t qa[HS / 16][4], da[HS / 16][4];
  load_a_fragments<T, HS>(qa, q + q_offset, row0, S, a.ld_q);
  load_a_fragments<T, HS>(da, dout + int64_t{b} * S * C + h * HS, row0, S, C);
  const int64_t stats = (int64_t{b} * NH + h) * S;
  const float row_lse[2] = {row0 < S ? lse[stats + row0] * kLog2e : 0.0f, row1 < S ? lse[stats + row1] * kLog2e : 0.0f};
  float row_delta[2] = {0.0f, 0.0f};
  {
    uint32_t oa[HS / 16][4];
    load_a_fragments<T, HS>(oa, out + int64_t{b} * S * C + h * HS, row0, S, C);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // registers 0 and 2 hold row0, 1 and 3 row1
        const float2 d = unpack<T>(da[kk][r]), o = unpack<T>(oa[kk][r]);
        row_delta[r % 2] += d.x * o.x + d.y * o.y;
      }
    }
    row_delta[0] = quad_sum(row_delta[0]);
    row_delta[1] = quad_sum(row_delta[1]);
    if (t == 0 && row0 < S) delta[stats + row0] = row_delta[0];
    if (t == 0 && row1 < S) delta[stats + row1] = row_delta[1];
  }
  float dq[HS / 8][4] = {};
  auto tile = [&](int k0, const T* ks, const T* vs) {
    if (k0 > warp_last) return;
    float s[kBk / 8][4], dp[kBk / 8][4];
    mma_abt<T, HS, kBk / 8>(s, qa, ks);
    mma_abt<T, HS, kBk / 8>(dp, da, vs);
    with_causal_mask(k0 + kBk - 1 > q0 + warp * 16,
                     [&](auto masked) { query_tile_ds<masked()>(s, dp, k0, row0, row_lse, row_delta, scale_log2); });
    mma_pb<T, HS, kBk>(dq, s, ks);
  };
  for_each_kv_tile<T, HS, kBk>(k_tiles, v_tiles, k + kv_offset, v + kv_offset, S, a.ld_kv, min(S, q0 + kBq), tile);
  store_rows<T, HS>(dq_out + q_offset, dq, row0, S, a.ld_q, scale, scale);
}

// dv = P^T dO and dk = scale * dS^T Q: a block owns kBk key rows (a warp 16 of them) and walks the
// query tiles at or after them through shared memory.
template <typename T, int HS, int kBq, int kBk, int kMinBlocks>
__global__ void __launch_bounds__(kBk * 2, kMinBlocks)
    flash_dkv_kernel(T* dk_out, T* dv_out, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                     const float* delta, AttentionShape a, float scale, float scale_log2) {
  constexpr int kTile = kBq * (HS + kPad);
  __shared__ __align__(16) T q_tiles[2 * kTile];
  __shared__ __align__(16) T do_tiles[2 * kTile];
  __shared__ float lse_tiles[2 * kBq], delta_tiles[2 * kBq];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int S = a.S, NH = a.NH, C = NH * HS, group = NH / a.NKV;
  const int b = blockIdx.y / a.NKV, kvh = blockIdx.y % a.NKV;
  const int k0 = blockIdx.x * kBk;  // the first key tiles see the most queries and start first
  const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
  const int key0 = k0 + warp * 16 + g;
  const int warp_first = k0 + warp * 16;
  uint32_t ka[HS / 16][4], va[HS / 16][4];
  load_a_fragments<T, HS>(ka, k + kv_offset, key0, S, a.ld_kv);
  load_a_fragments<T, HS>(va, v + kv_offset, key0, S, a.ld_kv);
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  // The query tiles at or after the keys, of each query head of the group in turn: dk and dv add up
  // the heads in head order without atomics. With one head a group this is GPT-2's walk.
  const int first_tile = k0 / kBq, tiles = (S + kBq - 1) / kBq;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const T* q_base = q + int64_t{b} * S * a.ld_q + h * HS;
    const T* do_base = dout + int64_t{b} * S * C + h * HS;
    const int64_t stats = (int64_t{b} * NH + h) * S;
    auto fetch = [&](int tile) {
      const int q0 = tile * kBq, buf = tile % 2;
      load_rows_async<T, kBq, HS>(q_tiles + buf * kTile, q_base, q0, S, a.ld_q);
      load_rows_async<T, kBq, HS>(do_tiles + buf * kTile, do_base, q0, S, C);
      cp_async_commit();
      for (int i = threadIdx.x; i < kBq; i += blockDim.x) {
        // A query past the end gets lse = inf: its probabilities are exactly 0.
        lse_tiles[buf * kBq + i] = q0 + i < S ? lse[stats + q0 + i] * kLog2e : INFINITY;
        delta_tiles[buf * kBq + i] = q0 + i < S ? delta[stats + q0 + i] : 0.0f;
      }
    };
    // The next head's first fetch overwrites a buffer this head's last tile may still be reading.
    __syncthreads();
    for_each_tile(first_tile, tiles, fetch, [&](int tile) {
      const int q0 = tile * kBq, buf = tile % 2;
      const T* qs = q_tiles + buf * kTile;
      const T* dos = do_tiles + buf * kTile;
      const float* lse_s = lse_tiles + buf * kBq;
      const float* delta_s = delta_tiles + buf * kBq;
      if (q0 + kBq - 1 < warp_first) return;  // every query of the tile precedes every key of this warp
      float pt[kBq / 8][4], dpt[kBq / 8][4];
      mma_abt<T, HS, kBq / 8>(pt, ka, qs);
      mma_abt<T, HS, kBq / 8>(dpt, va, dos);
      with_causal_mask(q0 < warp_first + 15,
                       [&](auto masked) { key_tile_ds<masked()>(pt, dpt, q0, key0, lse_s, delta_s, scale_log2); });
      mma_pb<T, HS, kBq>(dv, pt, dos);
      mma_pb<T, HS, kBq>(dk, dpt, qs);
    });
  }
  store_rows<T, HS>(dk_out + kv_offset, dk, key0, S, a.ld_kv, scale, scale);
  store_rows<T, HS>(dv_out + kv_offset, dv, key0, S, a.ld_kv, 1.0f, 1.0f);
}

// Tile sizes: every kernel owns 64 rows (a warp 16) and streams tiles of 32 rows past them. The
// kernels are latency-bound, so the streamed tile is kept small: its score fragments are the registers
// that decide how many blocks fit on a multiprocessor, and the k*Blocks below (the launch bounds'
// minimum, found on an H200 at GPT-2's shapes) are what fits without spilling. Halving the backward's
// streamed tile from 64 to 32 took it from 0.76 to 0.65 ms per layer, 2 -> 3 and 3 -> 4 blocks.
template <int HS>
struct Tiles {
  static constexpr int kRows = 64;
  static constexpr int kStream = 32;
  static constexpr int kForwardBlocks = HS > 64 ? 2 : 5;
  static constexpr int kDqBlocks = HS > 64 ? 2 : 4;
  static constexpr int kDkvBlocks = HS > 64 ? 1 : 3;
};

// Attention's operands are read through 16-byte copies and 4-byte fragment loads.
void check_alignment(const void* p, int64_t ld, size_t element_bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || (ld * static_cast<int64_t>(element_bytes)) % 16 != 0) {
    fail(ErrorKind::kInternal, std::string("flash attention: ") + what + " rows are not 16-byte aligned");
  }
}

template <typename T, int HS>
void forward_hs(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a, cudaStream_t st) {
  constexpr int kBq = Tiles<HS>::kRows, kBk = Tiles<HS>::kStream;
  const dim3 grid((a.S + kBq - 1) / kBq, a.B * a.NH);
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HS));
  flash_forward_kernel<T, HS, kBq, kBk, Tiles<HS>::kForwardBlocks>
      <<<grid, kBq * 2, 0, st>>>(out, lse, q, k, v, a, scale_log2);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T, int HS>
void backward_hs(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v,
                 const float* lse, const AttentionShape& a, cudaStream_t st) {
  constexpr int kRows = Tiles<HS>::kRows, kStream = Tiles<HS>::kStream;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS)), scale_log2 = scale * kLog2e;
  const int row_blocks = (a.S + kRows - 1) / kRows;
  flash_dq_kernel<T, HS, kRows, kStream, Tiles<HS>::kDqBlocks>
      <<<dim3(row_blocks, a.B * a.NH), kRows * 2, 0, st>>>(dq, delta, dout, out, q, k, v, lse, a, scale, scale_log2);
  CUDA_CHECK(cudaGetLastError());
  // A block per key tile of each kv head: the heads that share it are summed inside the block.
  flash_dkv_kernel<T, HS, kStream, kRows, Tiles<HS>::kDkvBlocks>
      <<<dim3(row_blocks, a.B * a.NKV), kRows * 2, 0, st>>>(dk, dv, dout, q, k, v, lse, delta, a, scale, scale_log2);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a,
                             cudaStream_t st) {
  check_alignment(q, a.ld_q, sizeof(T), "query");
  check_alignment(k, a.ld_kv, sizeof(T), "key");
  check_alignment(v, a.ld_kv, sizeof(T), "value");
  with_head_size(a.HS, [&](auto hs) { forward_hs<T, hs()>(out, lse, q, k, v, a, st); });
}

template <typename T>
void flash_attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                              const T* v, const float* lse, const AttentionShape& a, cudaStream_t st) {
  check_alignment(q, a.ld_q, sizeof(T), "query");
  check_alignment(k, a.ld_kv, sizeof(T), "key");
  check_alignment(v, a.ld_kv, sizeof(T), "value");
  check_alignment(dout, int64_t{a.NH} * a.HS, sizeof(T), "output gradient");
  with_head_size(a.HS, [&](auto hs) { backward_hs<T, hs()>(dq, dk, dv, delta, dout, out, q, k, v, lse, a, st); });
}

#define SHARDKIT_INSTANTIATE(T)                                                                                   \
  template void flash_attention_forward<T>(T*, float*, const T*, const T*, const T*, const AttentionShape&,       \
                                           cudaStream_t);                                                         \
  template void flash_attention_backward<T>(T*, T*, T*, float*, const T*, const T*, const T*, const T*, const T*, \
                                            const float*, const AttentionShape&, cudaStream_t);
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::cuda
