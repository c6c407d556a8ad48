// Hopper's own instructions for warp-specialised kernels: mbarriers, the bulk tensor copy engine (TMA),
// warpgroup matrix products (wgmma) with their shared-memory descriptors, and register reallocation
// between warpgroups. wgmma and setmaxnreg exist only in the sm_90a target: a file that uses them is
// compiled for it alone (its CMake target says so) and guards its kernels' bodies with SHARDKIT_SM90A,
// so that any other pass over the file compiles empty kernels that the host never launches.
//
// Shared-memory tiles are kept in the one layout both the copy engine and wgmma understand
// (model/cuda/tensor_map.hpp's constants): rows of 64 16-bit elements (128 bytes, a "chunk" of a wider
// row), 128-byte swizzled (the 16-byte units of row r are permuted by r % 8), grouped in atoms of 8 rows
// (1,024 bytes, which is also the alignment the swizzle needs). A tile of R rows and HS columns is
// HS / 64 such chunk tiles of R x 128 bytes, one after another.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "model/cuda/tensor_map.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SHARDKIT_SM90A 1
#endif

namespace shardkit::model::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarriers: a phase completes when `count` threads have arrived and the bytes announced with
// arrive_expect_tx have landed; waiters name the parity of the phase they wait for.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Makes initialised barriers visible to the copy engine, which completes transactions on them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Returns once the phase of the given parity has completed. A fresh barrier is in phase 0, and the
// phase before it (parity 1) counts as complete: a producer's first wait for a free buffer passes.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_address(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}

// --- The copy engine: box (c0, c1, c2, c3) of a 4-dimensional tensor map into shared memory, the
// bytes counted on `bar`. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// --- Register reallocation between warpgroups (every thread of the warpgroup executes it).
template <int kRegisters>
__device__ __forceinline__ void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// --- Named barriers (0 is __syncthreads'): `threads` (a multiple of 32) take part, as waiters or as
// arrivers that go on without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- Shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all in 16-byte units), swizzle mode 1 = 128 bytes.
__device__ __forceinline__ uint64_t matrix_descriptor(const void* start, uint32_t leading_bytes,
                                                      uint32_t stride_bytes) {
  return uint64_t{(smem_address(start) & 0x3FFFFu) >> 4} | uint64_t{leading_bytes >> 4} << 16 |
         uint64_t{stride_bytes >> 4} << 32 | uint64_t{1} << 62;
}
// An operand whose contracted dimension is contiguous (K-major): rows of a chunk tile, 8-row atoms
// kAtomBytes apart; one k16 step reads 32 bytes of each row, so its start moves 32 bytes a step within
// a chunk (the swizzle is applied to the absolute address) and a whole chunk tile every 4 steps.
__device__ __forceinline__ uint64_t k_major_descriptor(const void* start) {
  return matrix_descriptor(start, 16, kAtomBytes);
}
// An operand whose other dimension is contiguous (MN-major, read transposed): chunk tiles of 64
// columns `chunk_bytes` apart, the contracted dimension running down the rows in 8-row atoms.
__device__ __forceinline__ uint64_t mn_major_descriptor(const void* start, uint32_t chunk_bytes) {
  return matrix_descriptor(start, chunk_bytes, kAtomBytes);
}

// --- Warpgroup matrix products, fp32 accumulators. The accumulator fragment of m64nN is, for warp w of
// the warpgroup and g = lane / 4, t = lane % 4: d[n][i] = D[16w + g][8n + 2t + i] and
// d[n][2 + i] = D[16w + g + 8][8n + 2t + i] (i = 0, 1) -- mma.sync's m16n8 fragment for each 8
// columns (model/cuda/fragments.cuh), so a product's fp32 tile, rounded in pairs, is the A register
// fragment of the next one: a[0] = A[16w + g][2t..], a[1] = A[16w + g + 8][2t..], a[2] and a[3] the
// same rows 8 columns on.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of these registers across an asynchronous product:
// after the wait for a product, fence its accumulators (read next) and its A fragments (overwritten
// next), since the compiler sees the product's asm use them when it is issued, not when it ends.
template <int N8>
__device__ __forceinline__ void fence_registers(float (&r)[N8][4]) {
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(r[n][i])::"memory");
  }
}
template <int K16>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[K16][4]) {
#pragma unroll
  for (int n = 0; n < K16; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(r[n][i])::"memory");
  }
}

#define SHARDKIT_WGMMA(shape, type) "wgmma.mma_async.sync.aligned." shape ".f32." type "." type " "
#define SHARDKIT_ACC8(d, n)                                                                                            \
  "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3]), "+f"(d[n + 1][0]), "+f"(d[n + 1][1]), "+f"(d[n + 1][2]), \
      "+f"(d[n + 1][3])
#define SHARDKIT_ACC32(d) SHARDKIT_ACC8(d, 0), SHARDKIT_ACC8(d, 2), SHARDKIT_ACC8(d, 4), SHARDKIT_ACC8(d, 6)
#define SHARDKIT_ACC64(d) \
  SHARDKIT_ACC32(d), SHARDKIT_ACC8(d, 8), SHARDKIT_ACC8(d, 10), SHARDKIT_ACC8(d, 12), SHARDKIT_ACC8(d, 14)
#define SHARDKIT_D32                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SHARDKIT_D64                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// scale-d as a predicate: the first product of a tile overwrites, the rest accumulate.
#define SHARDKIT_SCALE_D(operand) ".reg .pred p;\nsetp.ne.b32 p, " operand ", 0;\n"

// d (64 x N) = or += A (64 x 16) * B (16 x N), A and B in shared memory, both K-major.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss is instantiated for N = 64 and 128");
  constexpr bool kHalf = std::is_same_v<T, __half>;
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (N == 64 && kHalf) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%34") SHARDKIT_WGMMA("m64n64k16", "f16") SHARDKIT_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SHARDKIT_ACC32(d)
                 : "l"(a), "l"(b), "r"(scale_d));
  } else if constexpr (N == 64) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%34") SHARDKIT_WGMMA("m64n64k16", "bf16") SHARDKIT_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SHARDKIT_ACC32(d)
                 : "l"(a), "l"(b), "r"(scale_d));
  } else if constexpr (kHalf) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%66") SHARDKIT_WGMMA("m64n128k16", "f16") SHARDKIT_D64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SHARDKIT_ACC64(d)
                 : "l"(a), "l"(b), "r"(scale_d));
  } else {
    asm volatile("{\n" SHARDKIT_SCALE_D("%66") SHARDKIT_WGMMA("m64n128k16", "bf16") SHARDKIT_D64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SHARDKIT_ACC64(d)
                 : "l"(a), "l"(b), "r"(scale_d));
  }
}

// d (64 x N) = or += A (64 x 16, register fragment) * B (16 x N), B in shared memory MN-major (read
// transposed).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_rs is instantiated for N = 64 and 128");
  constexpr bool kHalf = std::is_same_v<T, __half>;
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (N == 64 && kHalf) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%37") SHARDKIT_WGMMA("m64n64k16", "f16") SHARDKIT_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SHARDKIT_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  } else if constexpr (N == 64) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%37") SHARDKIT_WGMMA("m64n64k16", "bf16") SHARDKIT_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SHARDKIT_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  } else if constexpr (kHalf) {
    asm volatile("{\n" SHARDKIT_SCALE_D("%69") SHARDKIT_WGMMA("m64n128k16", "f16") SHARDKIT_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SHARDKIT_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  } else {
    asm volatile("{\n" SHARDKIT_SCALE_D("%69") SHARDKIT_WGMMA("m64n128k16", "bf16") SHARDKIT_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SHARDKIT_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
}

#undef SHARDKIT_SCALE_D
#undef SHARDKIT_D64
#undef SHARDKIT_D32
#undef SHARDKIT_ACC64
#undef SHARDKIT_ACC32
#undef SHARDKIT_ACC8
#undef SHARDKIT_WGMMA

}  // namespace shardkit::model::cuda::sm90
