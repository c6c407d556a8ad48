// Tiles on Hopper, composed from model/cuda/sm90.cuh's instructions: warp-specialised roles, the ring
// of buffers between a producer and its consumers, tiles copied in by the copy engine, and one
// warpgroup's matrix products over such tiles. Tiles are in tensor_map.hpp's layout (HS / 64 chunk
// tiles of `rows` rows x 128 bytes, 1,024-byte aligned); kernels that use this compile for sm_90a only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "model/cuda/sm90.cuh"
#include "model/cuda/tensor_map.hpp"

namespace shardkit::model::cuda::sm90 {

constexpr int kWarpgroup = 128;

// Whether a block of `threads` (one producer warpgroup, the rest consumers, launch bounds of one block
// a multiprocessor) can move to `producer` and `consumer` registers a thread. Every thread starts at
// the launch bounds' cap (65,536 over the block, rounded down to 8), and a consumer's setmaxnreg.inc
// is met only from what the producer's setmaxnreg.dec gave back: it waits for the rest, for ever if
// the producer gave too little.
constexpr bool registers_balance(int threads, int producer, int consumer) {
  const int entry = 65536 / threads / 8 * 8;
  return (entry - producer) * kWarpgroup >= (consumer - entry) * (threads - kWarpgroup);
}

// Runs producer() on warpgroup 0 and consumer(wg) on the warpgroups after it (wg = 0, 1, ...), each
// after moving registers from the first to the others (kProducerRegisters and kConsumerRegisters
// per thread; the kernel's launch bounds must cap registers at entry for this to take effect, and
// registers_balance must hold).
template <int kProducerRegisters, int kConsumerRegisters, typename Producer, typename Consumer>
__device__ __forceinline__ void split_roles(Producer&& producer, Consumer&& consumer) {
#if defined(SHARDKIT_SM90A)
  if (threadIdx.x < kWarpgroup) {
    shrink_registers<kProducerRegisters>();
    producer();
  } else {
    grow_registers<kConsumerRegisters>();
    consumer(static_cast<int>(threadIdx.x) / kWarpgroup - 1);
  }
#endif
}

// A ring of kStages buffers between a producer and its consumers, counted in uses: use u fills stage
// u % kStages, whose barriers are then in their (u / kStages)-th phase. `fill_arrivals` arrive on a full
// barrier (the copy engine's transaction bytes count on top), `consumers` threads on an empty one.
template <int kStages>
struct Ring {
  uint64_t full[kStages], empty[kStages];
  __device__ void init(uint32_t fill_arrivals, uint32_t consumers) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], fill_arrivals);
      mbarrier_init(&empty[s], consumers);
    }
  }
  static __device__ int stage(int use) { return use % kStages; }
  static __device__ uint32_t parity(int use) { return (use / kStages) & 1; }
  // The producer: waits until the consumers are done with the stage's previous use.
  __device__ void wait_free(int use) { mbarrier_wait(&empty[stage(use)], parity(use) ^ 1); }
  __device__ void wait_full(int use) { mbarrier_wait(&full[stage(use)], parity(use)); }
  __device__ void release(int use) { mbarrier_arrive(&empty[stage(use)]); }
};

// The dynamic shared memory base rounded up to the swizzle's 1,024-byte alignment (launch with
// kAtomBytes more than the tiles need).
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  return raw + (kAtomBytes - smem_address(raw) % kAtomBytes) % kAtomBytes;
}

// Brings a kernel's tensor maps (parameters) into the copy engine's cache ahead of the first copy.
template <typename... Maps>
__device__ __forceinline__ void prefetch_maps(const Maps&... maps) {
  (prefetch_tensor_map(&maps), ...);
}

// A tile of `rows` rows of a chunked-rows tensor map into shared memory, HS / 64 chunk tiles one after
// another, counted on `bar` (whose expected bytes the caller announced).
template <int HS>
__device__ __forceinline__ void load_tile(uint8_t* dst, int rows, const CUtensorMap* map, uint64_t* bar,
                                          int first_chunk, int row, int batch) {
  for (int c = 0; c < HS / kChunkElements; ++c) {
    tma_load_4d(dst + c * rows * kChunkRowBytes, map, bar, 0, first_chunk + c, row, batch);
  }
}

// Descriptor of k16 step kk of a K-major operand: rows from `rows0` of a tile of `rows` rows.
__device__ __forceinline__ uint64_t k_step(const uint8_t* tile, int rows, int rows0, int kk) {
  return k_major_descriptor(tile + (kk / 4) * rows * kChunkRowBytes + rows0 * kChunkRowBytes + (kk % 4) * 32);
}
// Descriptor of k16 step kk of an MN-major operand (contracted over the tile's rows).
__device__ __forceinline__ uint64_t mn_step(const uint8_t* tile, int rows, int kk) {
  return mn_major_descriptor(tile + kk * 16 * kChunkRowBytes, rows * kChunkRowBytes);
}

// Issues acc (64 x N) = A (64 rows from a0 of the K-major tile `a` of a_rows rows, HS columns) * B^T
// (the N rows of the K-major tile `b`, HS columns) as one committed group, not waited for: acc is not
// to be touched until wgmma_wait says the group is done and fence_registers(acc) follows. Every
// thread of the warpgroup calls it.
template <typename T, int HS, int N>
__device__ __forceinline__ void issue_abt(float (&acc)[N / 8][4], const uint8_t* a, int a_rows, int a0,
                                          const uint8_t* b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) wgmma_ss<T, N>(acc, k_step(a, a_rows, a0, kk), k_step(b, N, 0, kk), kk > 0);
  wgmma_commit();
}

// Issues acc (64 x HS) += P (64 x K, register fragments) * B (the K rows of the tile `b`, HS columns)
// as one committed group, not waited for: neither acc nor p is to be touched until the group is done
// (wgmma_wait, then fence_registers on both).
template <typename T, int HS, int K>
__device__ __forceinline__ void issue_pb(float (&acc)[HS / 8][4], const uint32_t (&p)[K / 16][4], const uint8_t* b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_rs<T, HS>(acc, p[kk], mn_step(b, K, kk), true);
  wgmma_commit();
}

// The same, waited for.
template <typename T, int HS, int N>
__device__ __forceinline__ void product_abt(float (&acc)[N / 8][4], const uint8_t* a, int a_rows, int a0,
                                            const uint8_t* b) {
  issue_abt<T, HS, N>(acc, a, a_rows, a0, b);
  wgmma_wait<0>();
  fence_registers(acc);
}
template <typename T, int HS, int K>
__device__ __forceinline__ void product_pb(float (&acc)[HS / 8][4], uint32_t (&p)[K / 16][4], const uint8_t* b) {
  issue_pb<T, HS, K>(acc, p, b);
  wgmma_wait<0>();
  fence_registers(acc);
  fence_registers(p);
}

// FlashAttention-3's ping-pong between two consumer warpgroups: they take turns issuing their
// products (named barriers 1 and 2), so that while one's products are on the tensor cores the other
// does its softmax. Warpgroup 0 goes first. Both must take the same number of turns, and the last turn
// of warpgroup 1 hands nothing over (every arrival then meets a wait).
class PingPong {
 public:
  __device__ explicit PingPong(int wg) : mine_(1 + wg), other_(2 - wg), second_(wg == 1) {
    if (second_) named_barrier_arrive(1, 2 * kWarpgroup);
  }
  template <typename Issue>
  __device__ __forceinline__ void turn(Issue&& issue, bool last) {
    named_barrier_sync(mine_, 2 * kWarpgroup);
    issue();
    if (!(last && second_)) named_barrier_arrive(other_, 2 * kWarpgroup);
  }

 private:
  int mine_, other_;
  bool second_;
};

// The rows a thread holds of warpgroup wg's 64 of a block's rows from `first`: its warp's first row,
// and row0 (and row0 + 8, the accumulator fragment's second row).
struct Rows {
  int warp_first, row0;
  __device__ Rows(int first, int wg) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    warp_first = first + wg * 64 + warp * 16;
    row0 = warp_first + lane / 4;
  }
};

}  // namespace shardkit::model::cuda::sm90
