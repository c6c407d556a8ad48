#include "tests/cuda/sm90_probes.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "base/error.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/fragments.cuh"
#include "model/cuda/sm90.cuh"
#include "model/cuda/sm90_tiles.cuh"
#include "model/cuda/tensor_map.hpp"

namespace shardkit::testing::sm90_probes {
namespace {

using model::cuda::kAtomBytes;
using model::cuda::kChunkElements;
using model::cuda::kChunkRowBytes;
namespace sm90 = model::cuda::sm90;
using T = __nv_bfloat16;

// Thread 0 starts the copies of `tiles` (each announced in `bytes`) on one barrier; everyone waits.
template <typename Load>
__device__ void copy_in(uint64_t* bar, uint32_t bytes, Load&& load) {
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(bar, bytes);
    load();
  }
  sm90::mbarrier_wait(bar, 0);
}

// Element (r, c) of a tile of `rows` rows in the swizzled chunk layout: chunk c / 64, row r, and the
// 16-byte unit of the 128-byte row permuted by r % 8.
__device__ const uint16_t* swizzled(const uint8_t* tile, int rows, int r, int c) {
  const int chunk = c / kChunkElements, byte = (c % kChunkElements) * 2;
  const int unit = (byte / 16) ^ (r % 8);
  return reinterpret_cast<const uint16_t*>(tile + chunk * rows * kChunkRowBytes + r * kChunkRowBytes + unit * 16 +
                                           byte % 16);
}

template <int HS>
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, uint16_t* out, int box_rows, int first_chunk,
                           int row, int batch) {
#if defined(SHARDKIT_SM90A)
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* tile = sm90::aligned_smem(raw);
  copy_in(&bar, box_rows * HS * 2, [&] { sm90::load_tile<HS>(tile, box_rows, &map, &bar, first_chunk, row, batch); });
  for (int i = threadIdx.x; i < box_rows * HS; i += blockDim.x) out[i] = *swizzled(tile, box_rows, i / HS, i % HS);
#endif
}

// This thread's part of a 64 x (8 N8) accumulator tile into out (row-major, ld columns).
template <int N8>
__device__ void write_accumulator(float* out, int ld, const float (&acc)[N8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = warp * 16 + lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      out[row * ld + n * 8 + 2 * t + i] = acc[n][i];
      out[(row + 8) * ld + n * 8 + 2 * t + i] = acc[n][2 + i];
    }
  }
}

template <int N, int HS>
__global__ void abt_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                           float* out) {
#if defined(SHARDKIT_SM90A)
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* a = sm90::aligned_smem(raw);
  uint8_t* b = a + 64 * HS * 2;
  copy_in(&bar, (64 + N) * HS * 2, [&] {
    sm90::load_tile<HS>(a, 64, &a_map, &bar, 0, 0, 0);
    sm90::load_tile<HS>(b, N, &b_map, &bar, 0, 0, 0);
  });
  float acc[N / 8][4];
  sm90::product_abt<T, HS, N>(acc, a, 64, 0, b);
  write_accumulator(out, N, acc);
#endif
}

template <int K, int HS>
__global__ void pb_kernel(const float* p, const __grid_constant__ CUtensorMap b_map, float* out) {
#if defined(SHARDKIT_SM90A)
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* b = sm90::aligned_smem(raw);
  copy_in(&bar, K * HS * 2, [&] { sm90::load_tile<HS>(b, K, &b_map, &bar, 0, 0, 0); });
  // p's rows as an accumulator tile, then as the fragments the kernels make of one.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = warp * 16 + lane / 4, t = lane % 4;
  float x[K / 8][4];
#pragma unroll
  for (int n = 0; n < K / 8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      x[n][i] = p[row * K + n * 8 + 2 * t + i];
      x[n][2 + i] = p[(row + 8) * K + n * 8 + 2 * t + i];
    }
  }
  uint32_t frag[K / 16][4];
  model::cuda::to_fragments<T, K>(frag, x);
  float acc[HS / 8][4] = {};
  sm90::product_pb<T, HS, K>(acc, frag, b);
  write_accumulator(out, HS, acc);
#endif
}

CUtensorMap rows_map(const void* base, int64_t chunks, int64_t rows, int64_t batches, int64_t row_elements,
                     int box_rows) {
  return model::cuda::chunked_rows_map(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, chunks, rows, batches, row_elements * 2,
                                       box_rows);
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, int smem_bytes, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes + kAtomBytes));
  kernel<<<1, sm90::kWarpgroup, smem_bytes + kAtomBytes>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

template <typename F>
void with_size(int size, const char* what, F&& f) {
  if (size == 64) {
    f(std::integral_constant<int, 64>{});
  } else if (size == 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    fail(ErrorKind::kInvalidInput, std::string(what) + " must be 64 or 128, not " + std::to_string(size));
  }
}

}  // namespace

void tma_round_trip(uint16_t* out, const uint16_t* src, int64_t chunks, int64_t rows, int64_t batches,
                    int64_t row_elements, int box_rows, int hs, int first_chunk, int row, int batch) {
  const CUtensorMap map = rows_map(src, chunks, rows, batches, row_elements, box_rows);
  with_size(hs, "hs",
            [&](auto h) { launch(tma_kernel<h()>, box_rows * h() * 2, map, out, box_rows, first_chunk, row, batch); });
}

void product_abt(float* out, const uint16_t* a, const uint16_t* b, int n, int hs) {
  with_size(n, "n", [&](auto nn) {
    with_size(hs, "hs", [&](auto h) {
      const CUtensorMap a_map = rows_map(a, h() / kChunkElements, 64, 1, h(), 64);
      const CUtensorMap b_map = rows_map(b, h() / kChunkElements, nn(), 1, h(), nn());
      launch(abt_kernel<nn(), h()>, (64 + nn()) * h() * 2, a_map, b_map, out);
    });
  });
}

void product_pb(float* out, const float* p, const uint16_t* b, int k, int hs) {
  with_size(k, "k", [&](auto kk) {
    with_size(hs, "hs", [&](auto h) {
      const CUtensorMap b_map = rows_map(b, h() / kChunkElements, kk(), 1, h(), kk());
      launch(pb_kernel<kk(), h()>, kk() * h() * 2, p, b_map, out);
    });
  });
}

}  // namespace shardkit::testing::sm90_probes
