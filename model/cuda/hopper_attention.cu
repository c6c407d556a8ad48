#include "model/cuda/hopper_attention.hpp"

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "model/cuda/causal_order.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/fragments.cuh"
#include "model/cuda/sm90.cuh"
#include "model/cuda/sm90_tiles.cuh"
#include "model/cuda/tensor_map.hpp"

namespace shardkit::model::cuda {
namespace {

// Every kernel here is one producer warpgroup (a warp of it issues the copies) and two consumer
// warpgroups of 64 rows each: a block owns kOwned rows (queries in the forward and dq kernels, keys in
// the dk/dv kernel) and streams tiles of the other side through rings of kStages buffers.
using sm90::kWarpgroup;
constexpr int kConsumers = 2 * kWarpgroup;
constexpr int kThreads = kWarpgroup + kConsumers;
constexpr int kOwned = 128;
constexpr int kStages = 2;
using Ring = sm90::Ring<kStages>;
// Registers after reallocation: the producer gives up what the consumers' fragments need (from the
// entry cap of 168: 144 x 128 given back, 72 x 256 taken).
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(sm90::registers_balance(kThreads, kProducerRegisters, kConsumerRegisters));

template <typename Producer, typename Consumer>
__device__ __forceinline__ void split_roles(Producer&& producer, Consumer&& consumer) {
  sm90::split_roles<kProducerRegisters, kConsumerRegisters>(producer, consumer);
}

// Shared memory of a kernel: kOwnedTiles tiles of kOwned rows (loaded once), then two rings of kStages
// tiles of kTileRows rows; every tile HS / 64 chunk tiles, 1,024-byte aligned.
template <int HS, int kOwnedTiles, int kTileRows>
struct Layout {
  static constexpr int kRows = kTileRows;
  static constexpr int kOwnedBytes = kOwned * HS * 2;
  static constexpr int kTileBytes = kTileRows * HS * 2;
  static constexpr int owned(int i) { return i * kOwnedBytes; }
  static constexpr int kRing0 = kOwnedTiles * kOwnedBytes;
  static constexpr int kRing1 = kRing0 + kStages * kTileBytes;
  static constexpr int kLaunchBytes = kRing1 + kStages * kTileBytes + kAtomBytes;  // room to align the base
  static constexpr int ring0(int stage) { return kRing0 + stage * kTileBytes; }
  static constexpr int ring1(int stage) { return kRing1 + stage * kTileBytes; }
};

// The forward and dq kernels' barriers: their owned tiles (q, and dO for dq) on one, key and value tiles
// in rings 0 and 1.
struct KvBarriers {
  uint64_t owned_full;
  Ring k, v;
  __device__ void init() {
    sm90::mbarrier_init(&owned_full, 1);
    k.init(1, kConsumers);
    v.init(1, kConsumers);
    sm90::fence_barrier_init();
  }
};

// Their producer's walk once the owned tiles are on their way: key tile j into ring 0 and value tile
// j into ring 1 (L::kRows rows each, kv head chunks from kv_chunk), j < tiles.
template <int HS, typename L>
__device__ __forceinline__ void stream_kv(uint8_t* smem, KvBarriers& bars, const CUtensorMap* k_map,
                                          const CUtensorMap* v_map, int kv_chunk, int tiles, int b) {
  for (int j = 0; j < tiles; ++j) {
    const int s = Ring::stage(j);
    bars.k.wait_free(j);
    sm90::mbarrier_arrive_expect_tx(&bars.k.full[s], L::kTileBytes);
    sm90::load_tile<HS>(smem + L::ring0(s), L::kRows, k_map, &bars.k.full[s], kv_chunk, j * L::kRows, b);
    bars.v.wait_free(j);
    sm90::mbarrier_arrive_expect_tx(&bars.v.full[s], L::kTileBytes);
    sm90::load_tile<HS>(smem + L::ring1(s), L::kRows, v_map, &bars.v.full[s], kv_chunk, j * L::kRows, b);
  }
}

// The forward and dq kernels' block: a (batch, head) and kOwned query rows from q0 (rank 0, the
// longest, owns the last rows: they see the most keys); the key tiles of `rows` rows its queries see.
struct QueryBlock {
  int b, h, kvh, q0;
  __device__ QueryBlock(const AttentionShape& a, const CausalOrder& order) {
    const CausalOrder::Block blk = order.block(blockIdx.x);
    b = blk.row / a.NH;
    h = blk.row % a.NH;
    kvh = h / (a.NH / a.NKV);
    q0 = (order.blocks_per_row - 1 - blk.rank) * kOwned;
  }
  __device__ int key_tiles(int S, int rows) const { return (min(S, q0 + kOwned) + rows - 1) / rows; }
};

// ---------------------------------------------------------------------------------------------------
// Forward: a block owns kOwned query rows of one (batch, head) and streams key/value tiles of kKeys.
constexpr int kForwardKeys = 128;
// At head size 64 a tile's two products take about as many cycles as its exponentials take on the
// special-function unit: every kPolyExp2Every-th column group of an unmasked tile computes them on the
// FMA pipe instead (exp2_poly). The FMA pipe carries the rest of the softmax too: past about one
// group in eight it becomes the bound (the share is chosen by measurement, bench/RESULTS.md). At 128
// the products take twice as long and the unit keeps up.
template <int HS>
constexpr int kPolyExp2Every = HS == 64 ? 8 : 0;

template <int HS>
using ForwardLayout = Layout<HS, 1, kForwardKeys>;  // q; rings of k and v

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map, T* out, float* lse, AttentionShape a,
                          CausalOrder order, float scale_log2) {
#if defined(SHARDKIT_SM90A)
  using L = ForwardLayout<HS>;
  constexpr int kKeys = kForwardKeys, kChunks = HS / kChunkElements;
  extern __shared__ uint8_t smem_raw[];
  __shared__ KvBarriers bars;
  uint8_t* smem = sm90::aligned_smem(smem_raw);
  const int S = a.S, NH = a.NH;
  const QueryBlock blk(a, order);
  const int b = blk.b, h = blk.h, kvh = blk.kvh, q0 = blk.q0, tiles = blk.key_tiles(S, kKeys);
  if (threadIdx.x == 0) bars.init();
  __syncthreads();
  split_roles(
      [&] {
        if (threadIdx.x != 0) return;
        sm90::prefetch_maps(q_map, k_map, v_map);
        sm90::mbarrier_arrive_expect_tx(&bars.owned_full, L::kOwnedBytes);
        sm90::load_tile<HS>(smem + L::owned(0), kOwned, &q_map, &bars.owned_full, h * kChunks, q0, b);
        stream_kv<HS, L>(smem, bars, &k_map, &v_map, kvh * kChunks, tiles, b);
      },
      [&](int wg) {
        const sm90::Rows r(q0, wg);
        float o[HS / 8][4] = {};
        OnlineSoftmax softmax;
        // Scores of tile j into probabilities: only the block's last tile crosses the diagonal (keys
        // past S all follow it).
        auto probabilities = [&](float(&s)[kKeys / 8][4], int j) {
          OnlineSoftmax::Rescale rescale{};
          with_causal_mask(j == tiles - 1, [&](auto masked) {
            rescale = softmax.probabilities<masked(), kPolyExp2Every<HS>>(s, j * kKeys, r.row0, scale_log2);
          });
          return rescale;
        };
        // Software-pipelined as FlashAttention-3 describes: while the tensor cores add P(j-1) V(j-1)
        // into o, this warpgroup turns the scores of tile j (issued just before) into probabilities;
        // o is rescaled once that product is done, and P(j) takes P(j-1)'s registers. The two
        // warpgroups take turns issuing (ping-pong), one's softmax beside the other's products.
        float s[kKeys / 8][4];
        uint32_t p[kKeys / 16][4];
        sm90::PingPong turns(wg);
        sm90::mbarrier_wait(&bars.owned_full, 0);
        bars.k.wait_full(0);
        turns.turn([&] { sm90::issue_abt<T, HS, kKeys>(s, smem + L::owned(0), kOwned, wg * 64, smem + L::ring0(0)); },
                   false);
        sm90::wgmma_wait<0>();
        sm90::fence_registers(s);
        bars.k.release(0);
        probabilities(s, 0);  // o is still zero: nothing to rescale
        to_fragments<T, kKeys>(p, s);
        for (int j = 1; j < tiles; ++j) {
          bars.k.wait_full(j);
          bars.v.wait_full(j - 1);
          turns.turn(
              [&] {
                sm90::issue_abt<T, HS, kKeys>(s, smem + L::owned(0), kOwned, wg * 64, smem + L::ring0(Ring::stage(j)));
                sm90::issue_pb<T, HS, kKeys>(o, p, smem + L::ring1(Ring::stage(j - 1)));
              },
              false);
          sm90::wgmma_wait<1>();  // the scores (the older group) are in
          sm90::fence_registers(s);
          bars.k.release(j);
          const OnlineSoftmax::Rescale rescale = probabilities(s, j);
          sm90::wgmma_wait<0>();  // P(j-1) V(j-1) is in o, and p is free
          sm90::fence_registers(o);
          sm90::fence_registers(p);
          bars.v.release(j - 1);
          rescale.apply(o);
          to_fragments<T, kKeys>(p, s);
        }
        bars.v.wait_full(tiles - 1);
        turns.turn([&] { sm90::issue_pb<T, HS, kKeys>(o, p, smem + L::ring1(Ring::stage(tiles - 1))); }, true);
        sm90::wgmma_wait<0>();
        sm90::fence_registers(o);
        sm90::fence_registers(p);
        bars.v.release(tiles - 1);
        softmax.finish();
        const int64_t C = int64_t{NH} * HS;
        store_rows<T, HS>(out + int64_t{b} * S * C + h * HS, o, r.row0, S, C, 1.0f / softmax.l[0], 1.0f / softmax.l[1]);
        if (threadIdx.x % 4 == 0) softmax.store_lse(lse + (int64_t{b} * NH + h) * S, r.row0, S, scale_log2);
      });
#endif
}

// ---------------------------------------------------------------------------------------------------
// Backward, in two kernels as flash_attention.cu's (no atomics, so the same bits every run): dq by
// query tile, then dk and dv by key tile, each recomputing the probabilities from lse.

// dq = scale * dS K with dS = P o (dO V^T - delta): a block owns kOwned query rows, like the forward,
// and streams key/value tiles of kDqKeys. delta = rowsum(dO o O) is computed here and written out for
// the dk/dv kernel.
constexpr int kDqKeys = 64;

template <int HS>
using DqLayout = Layout<HS, 2, kDqKeys>;  // q, dO; rings of k and v

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_dq_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
                     const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map, T* dq_out,
                     float* delta, const T* dout, const T* out, const float* lse, AttentionShape a, CausalOrder order,
                     float scale, float scale_log2) {
#if defined(SHARDKIT_SM90A)
  using L = DqLayout<HS>;
  constexpr int kKeys = kDqKeys, kChunks = HS / kChunkElements;
  extern __shared__ uint8_t smem_raw[];
  __shared__ KvBarriers bars;
  uint8_t* smem = sm90::aligned_smem(smem_raw);
  const int S = a.S, NH = a.NH;
  const QueryBlock blk(a, order);
  const int b = blk.b, h = blk.h, kvh = blk.kvh, q0 = blk.q0, tiles = blk.key_tiles(S, kKeys);
  if (threadIdx.x == 0) bars.init();
  __syncthreads();
  split_roles(
      [&] {
        if (threadIdx.x != 0) return;
        sm90::prefetch_maps(q_map, do_map, k_map, v_map);
        sm90::mbarrier_arrive_expect_tx(&bars.owned_full, 2 * L::kOwnedBytes);
        sm90::load_tile<HS>(smem + L::owned(0), kOwned, &q_map, &bars.owned_full, h * kChunks, q0, b);
        sm90::load_tile<HS>(smem + L::owned(1), kOwned, &do_map, &bars.owned_full, h * kChunks, q0, b);
        stream_kv<HS, L>(smem, bars, &k_map, &v_map, kvh * kChunks, tiles, b);
      },
      [&](int wg) {
        const sm90::Rows r(q0, wg);
        const int row0 = r.row0, row1 = row0 + 8, t = threadIdx.x % 4;
        const int64_t C = int64_t{NH} * HS, stats = (int64_t{b} * NH + h) * S;
        // delta of this thread's rows from its columns of dO and O (the accumulators' columns),
        // summed over the quad.
        float row_delta[2] = {0.0f, 0.0f};
        {
          const T* do_head = dout + int64_t{b} * S * C + h * HS;
          const T* out_head = out + int64_t{b} * S * C + h * HS;
#pragma unroll
          for (int n = 0; n < HS / 8; ++n) {
            const int c = n * 8 + 2 * t;
            if (row0 < S) {
              const float2 d = unpack<T>(*reinterpret_cast<const uint32_t*>(do_head + row0 * C + c));
              const float2 o = unpack<T>(*reinterpret_cast<const uint32_t*>(out_head + row0 * C + c));
              row_delta[0] += d.x * o.x + d.y * o.y;
            }
            if (row1 < S) {
              const float2 d = unpack<T>(*reinterpret_cast<const uint32_t*>(do_head + row1 * C + c));
              const float2 o = unpack<T>(*reinterpret_cast<const uint32_t*>(out_head + row1 * C + c));
              row_delta[1] += d.x * o.x + d.y * o.y;
            }
          }
          row_delta[0] = quad_sum(row_delta[0]);
          row_delta[1] = quad_sum(row_delta[1]);
          if (t == 0 && row0 < S) delta[stats + row0] = row_delta[0];
          if (t == 0 && row1 < S) delta[stats + row1] = row_delta[1];
        }
        const float row_lse[2] = {row0 < S ? lse[stats + row0] * kLog2e : 0.0f,
                                  row1 < S ? lse[stats + row1] * kLog2e : 0.0f};
        float dq[HS / 8][4] = {};
        sm90::mbarrier_wait(&bars.owned_full, 0);
        for (int j = 0; j < tiles; ++j) {
          const int st = Ring::stage(j), k0 = j * kKeys;
          const uint8_t* k_tile = smem + L::ring0(st);
          float s[kKeys / 8][4], dp[kKeys / 8][4];
          // Both products issued at once: the probabilities are made while dP is on the tensor cores.
          bars.k.wait_full(j);
          sm90::issue_abt<T, HS, kKeys>(s, smem + L::owned(0), kOwned, wg * 64, k_tile);
          bars.v.wait_full(j);
          sm90::issue_abt<T, HS, kKeys>(dp, smem + L::owned(1), kOwned, wg * 64, smem + L::ring1(st));
          sm90::wgmma_wait<1>();
          sm90::fence_registers(s);
          with_causal_mask(k0 + kKeys - 1 > r.warp_first,
                           [&](auto masked) { query_tile_probabilities<masked()>(s, k0, row0, row_lse, scale_log2); });
          sm90::wgmma_wait<0>();
          sm90::fence_registers(dp);
          bars.v.release(j);
          query_tile_ds_from_p(s, dp, row_delta);
          uint32_t ds[kKeys / 16][4];
          to_fragments<T, kKeys>(ds, s);
          sm90::product_pb<T, HS, kKeys>(dq, ds, k_tile);
          bars.k.release(j);
        }
        store_rows<T, HS>(dq_out + int64_t{b} * S * a.ld_q + h * HS, dq, row0, S, a.ld_q, scale, scale);
      });
#endif
}

// dv = P^T dO and dk = scale * dS^T Q: a block owns kOwned key rows of one kv head and streams the
// query tiles (kDkvQueries rows) at or after them, of each query head of the group in turn, so dk and
// dv add the heads up in head order. The producer warp copies each tile's lse and delta into shared
// memory beside the copy engine's q tile (queries past S get lse = inf: probability 0).
constexpr int kDkvQueries = 64;

template <int HS>
using DkvLayout = Layout<HS, 2, kDkvQueries>;  // k, v; rings of q and dO

// The dk/dv kernel's barriers, and the lse and delta of the q ring's tiles (log2 units for lse).
struct DkvShared {
  uint64_t kv_full;
  Ring q, d;  // q with its lse and delta; dO
  float lse[kStages][kDkvQueries], delta[kStages][kDkvQueries];
};

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_dkv_kernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                      const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map, T* dk_out,
                      T* dv_out, const float* lse, const float* delta, AttentionShape a, CausalOrder order, float scale,
                      float scale_log2) {
#if defined(SHARDKIT_SM90A)
  using L = DkvLayout<HS>;
  constexpr int kQueries = kDkvQueries, kChunks = HS / kChunkElements;
  extern __shared__ uint8_t smem_raw[];
  __shared__ DkvShared bars;
  uint8_t* smem = sm90::aligned_smem(smem_raw);
  const int S = a.S, NH = a.NH, group = NH / a.NKV;
  const CausalOrder::Block blk = order.block(blockIdx.x);
  const int b = blk.row / a.NKV, kvh = blk.row % a.NKV;
  const int k0 = blk.rank * kOwned;  // the first key tiles see the most queries: rank 0, the longest
  const int first_tile = k0 / kQueries, tiles = (S + kQueries - 1) / kQueries;
  constexpr int kProducerLanes = 32;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bars.kv_full, 1);
    // The q ring's fills: the copy engine's bytes, announced by lane 0 (one arrival), and every lane
    // of the producer warp arriving once it has stored its share of lse and delta.
    bars.q.init(1 + kProducerLanes, kConsumers);
    bars.d.init(1, kConsumers);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  split_roles(
      [&] {
        if (threadIdx.x >= kProducerLanes) return;
        const int lane = threadIdx.x;
        if (lane == 0) {
          sm90::prefetch_maps(k_map, v_map, q_map, do_map);
          sm90::mbarrier_arrive_expect_tx(&bars.kv_full, 2 * L::kOwnedBytes);
          sm90::load_tile<HS>(smem + L::owned(0), kOwned, &k_map, &bars.kv_full, kvh * kChunks, k0, b);
          sm90::load_tile<HS>(smem + L::owned(1), kOwned, &v_map, &bars.kv_full, kvh * kChunks, k0, b);
        }
        int use = 0;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const int64_t stats = (int64_t{b} * NH + h) * S;
          for (int tile = first_tile; tile < tiles; ++tile, ++use) {
            const int s = Ring::stage(use), q0 = tile * kQueries;
            bars.q.wait_free(use);
            if (lane == 0) {
              sm90::mbarrier_arrive_expect_tx(&bars.q.full[s], L::kTileBytes);
              sm90::load_tile<HS>(smem + L::ring0(s), kQueries, &q_map, &bars.q.full[s], h * kChunks, q0, b);
            }
            for (int e = lane; e < kQueries; e += kProducerLanes) {
              const int q = q0 + e;
              bars.lse[s][e] = q < S ? lse[stats + q] * kLog2e : INFINITY;
              bars.delta[s][e] = q < S ? delta[stats + q] : 0.0f;
            }
            sm90::mbarrier_arrive(&bars.q.full[s]);
            bars.d.wait_free(use);
            if (lane == 0) {
              sm90::mbarrier_arrive_expect_tx(&bars.d.full[s], L::kTileBytes);
              sm90::load_tile<HS>(smem + L::ring1(s), kQueries, &do_map, &bars.d.full[s], h * kChunks, q0, b);
            }
          }
        }
      },
      [&](int wg) {
        const sm90::Rows r(k0, wg);
        const int key0 = r.row0;
        float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
        sm90::mbarrier_wait(&bars.kv_full, 0);
        int use = 0;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int tile = first_tile; tile < tiles; ++tile, ++use) {
            const int s = Ring::stage(use), q0 = tile * kQueries;
            const uint8_t* q_tile = smem + L::ring0(s);
            const uint8_t* do_tile = smem + L::ring1(s);
            float pt[kQueries / 8][4], dpt[kQueries / 8][4];
            // Both score products issued at once (P^T is made while dP^T is on the tensor cores), and
            // both gradient products, waited for together.
            bars.q.wait_full(use);
            sm90::issue_abt<T, HS, kQueries>(pt, smem + L::owned(0), kOwned, wg * 64, q_tile);
            bars.d.wait_full(use);
            sm90::issue_abt<T, HS, kQueries>(dpt, smem + L::owned(1), kOwned, wg * 64, do_tile);
            sm90::wgmma_wait<1>();
            sm90::fence_registers(pt);
            with_causal_mask(q0 < r.warp_first + 15, [&](auto masked) {
              key_tile_probabilities<masked()>(pt, q0, key0, bars.lse[s], scale_log2);
            });
            sm90::wgmma_wait<0>();
            sm90::fence_registers(dpt);
            key_tile_ds_from_p(dpt, pt, bars.delta[s]);
            uint32_t pf[kQueries / 16][4], dsf[kQueries / 16][4];
            to_fragments<T, kQueries>(pf, pt);
            to_fragments<T, kQueries>(dsf, dpt);
            sm90::issue_pb<T, HS, kQueries>(dv, pf, do_tile);
            sm90::issue_pb<T, HS, kQueries>(dk, dsf, q_tile);
            sm90::wgmma_wait<0>();
            sm90::fence_registers(dv);
            sm90::fence_registers(dk);
            sm90::fence_registers(pf);
            sm90::fence_registers(dsf);
            bars.q.release(use);
            bars.d.release(use);
          }
        }
        const int64_t kv_offset = int64_t{b} * S * a.ld_kv + kvh * HS;
        store_rows<T, HS>(dk_out + kv_offset, dk, key0, S, a.ld_kv, scale, scale);
        store_rows<T, HS>(dv_out + kv_offset, dv, key0, S, a.ld_kv, 1.0f, 1.0f);
      });
#endif
}

// ---------------------------------------------------------------------------------------------------
// Host side.

template <typename T>
constexpr CUtensorMapDataType tensor_map_type() {
  return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// The tensor map of one operand: heads x HS columns of rows ld elements apart, boxes of box_rows rows.
template <typename T, int HS>
CUtensorMap operand_map(const T* base, int heads, int64_t ld, const AttentionShape& a, int box_rows) {
  return chunked_rows_map(base, tensor_map_type<T>(), int64_t{heads} * (HS / kChunkElements), a.S, a.B,
                          ld * static_cast<int64_t>(sizeof(T)), box_rows);
}

template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// One block of kOwned rows per multiprocessor at a time (the launch bounds, and the shared memory).
CausalOrder causal_order(const AttentionShape& a, int heads) {
  return CausalOrder::for_grid((a.S + kOwned - 1) / kOwned, a.B * heads, multiprocessors());
}

template <typename T, int HS>
void forward_hs(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a, cudaStream_t st) {
  const auto q_map = operand_map<T, HS>(q, a.NH, a.ld_q, a, kOwned);
  const auto k_map = operand_map<T, HS>(k, a.NKV, a.ld_kv, a, kForwardKeys);
  const auto v_map = operand_map<T, HS>(v, a.NKV, a.ld_kv, a, kForwardKeys);
  constexpr int kBytes = ForwardLayout<HS>::kLaunchBytes;
  allow_smem(hopper_forward_kernel<T, HS>, kBytes);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  const CausalOrder order = causal_order(a, a.NH);
  hopper_forward_kernel<T, HS>
      <<<order.blocks(), kThreads, kBytes, st>>>(q_map, k_map, v_map, out, lse, a, order, scale_log2);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T, int HS>
void backward_hs(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k, const T* v,
                 const float* lse, const AttentionShape& a, cudaStream_t st) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS)), scale_log2 = scale * kLog2e;
  const int64_t C = int64_t{a.NH} * HS;
  {
    const auto q_map = operand_map<T, HS>(q, a.NH, a.ld_q, a, kOwned);
    const auto do_map = operand_map<T, HS>(dout, a.NH, C, a, kOwned);
    const auto k_map = operand_map<T, HS>(k, a.NKV, a.ld_kv, a, kDqKeys);
    const auto v_map = operand_map<T, HS>(v, a.NKV, a.ld_kv, a, kDqKeys);
    constexpr int kBytes = DqLayout<HS>::kLaunchBytes;
    allow_smem(hopper_dq_kernel<T, HS>, kBytes);
    const CausalOrder order = causal_order(a, a.NH);
    hopper_dq_kernel<T, HS><<<order.blocks(), kThreads, kBytes, st>>>(q_map, do_map, k_map, v_map, dq, delta, dout, out,
                                                                      lse, a, order, scale, scale_log2);
    CUDA_CHECK(cudaGetLastError());
  }
  const auto k_map = operand_map<T, HS>(k, a.NKV, a.ld_kv, a, kOwned);
  const auto v_map = operand_map<T, HS>(v, a.NKV, a.ld_kv, a, kOwned);
  const auto q_map = operand_map<T, HS>(q, a.NH, a.ld_q, a, kDkvQueries);
  const auto do_map = operand_map<T, HS>(dout, a.NH, C, a, kDkvQueries);
  constexpr int kBytes = DkvLayout<HS>::kLaunchBytes;
  allow_smem(hopper_dkv_kernel<T, HS>, kBytes);
  const CausalOrder order = causal_order(a, a.NKV);
  hopper_dkv_kernel<T, HS><<<order.blocks(), kThreads, kBytes, st>>>(k_map, v_map, q_map, do_map, dk, dv, lse, delta, a,
                                                                     order, scale, scale_log2);
  CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p, int64_t ld, size_t element_bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * static_cast<int64_t>(element_bytes)) % 16 == 0;
}

template <typename F>
void with_hopper_head_size(int head_size, F&& f) {
  if (head_size == 64) {
    f(std::integral_constant<int, 64>{});
  } else if (head_size == 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    fail(ErrorKind::kInternal, "the sm_90 attention kernels take head sizes 64 and 128, not " +
                                   std::to_string(head_size) + " (see hopper_attention_supports)");
  }
}

template <typename T>
void require_supported(const AttentionShape& a, const T* q, const T* k, const T* v, const T* dout = nullptr) {
  if (!hopper_attention_supports(a, q, k, v, dout)) {
    fail(ErrorKind::kInternal, "the sm_90 attention kernels were called for head size " + std::to_string(a.HS) +
                                   ", operands or a device they do not take (see hopper_attention_supports)");
  }
}

}  // namespace

bool hopper_attention_supports(const AttentionShape& a, const void* q, const void* k, const void* v, const void* dout) {
  if (a.HS != 64 && a.HS != 128) return false;
  constexpr size_t k16Bit = 2;
  if (!aligned16(q, a.ld_q, k16Bit) || !aligned16(k, a.ld_kv, k16Bit) || !aligned16(v, a.ld_kv, k16Bit)) return false;
  if (dout != nullptr && !aligned16(dout, int64_t{a.NH} * a.HS, k16Bit)) return false;
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;  // sm_90a code runs on exactly this compute capability
}

template <typename T>
void hopper_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& a,
                              cudaStream_t st) {
  require_supported(a, q, k, v);
  with_hopper_head_size(a.HS, [&](auto hs) { forward_hs<T, hs()>(out, lse, q, k, v, a, st); });
}

template <typename T>
void hopper_attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                               const T* v, const float* lse, const AttentionShape& a, cudaStream_t st) {
  require_supported(a, q, k, v, dout);
  with_hopper_head_size(a.HS,
                        [&](auto hs) { backward_hs<T, hs()>(dq, dk, dv, delta, dout, out, q, k, v, lse, a, st); });
}

#define SHARDKIT_INSTANTIATE(T)                                                                                    \
  template void hopper_attention_forward<T>(T*, float*, const T*, const T*, const T*, const AttentionShape&,       \
                                            cudaStream_t);                                                         \
  template void hopper_attention_backward<T>(T*, T*, T*, float*, const T*, const T*, const T*, const T*, const T*, \
                                             const float*, const AttentionShape&, cudaStream_t);
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)
#undef SHARDKIT_INSTANTIATE

}  // namespace shardkit::model::cuda
