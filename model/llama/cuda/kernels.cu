#include <algorithm>
#include <string>

#include "model/llama/cuda/kernels.cuh"
#include "trainer/cuda/cuda_common.hpp"
#include "trainer/cuda/kernels.cuh"
#include "trainer/cuda/launch.cuh"

// Correctness first: every kernel here reads and writes one element per thread per step (no 16-byte
// vectors). The RMSNorm kernels would gain from the vector loads of trainer/cuda's LayerNorm and the
// element-wise ones from fusing into the matrix products' epilogues (SwiGLU with the gate/up product,
// RoPE with the q/k product).

namespace shardkit::model::llama {
namespace {

using trainer::cuda::add_column_sums;
using trainer::cuda::blocks_for;
using trainer::cuda::check_launch;
using trainer::cuda::warp_sum;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* inputs, const T* embed, int N, int H) {
  const int64_t total = int64_t{N} * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = embed[int64_t{inputs[i / H]} * H + i % H];
  }
}

// A warp per row; the row's second pass finds it in cache.
constexpr int kRowsPerBlock = 8;
template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* weight, int N, int H, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + int64_t{row} * H;
  float ss = 0.0f;
  for (int c = lane; c < H; c += 32) {
    const float v = static_cast<float>(xr[c]);
    ss += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(H) + eps);
  T* o = out + int64_t{row} * H;
  for (int c = lane; c < H; c += 32) {
    o[c] = static_cast<T>(static_cast<float>(weight[c]) * (static_cast<float>(xr[c]) * s));
  }
  if (lane == 0) rstd[row] = s;
}

// A warp per row, over the block's R rows; with y = w x s, dx = s (w dy - x s^2 mean(w dy x)). The
// weight-gradient terms dy x s of the warp's rows add up in the warp's own slice of shared memory
// (each lane owns the channels it reads, so no float is shared); the block then adds its warps'
// slices in warp order into partial[block], and add_column_sums adds the blocks' partials in a fixed
// order: the same bits on every run.
template <typename T>
__global__ void rmsnorm_backward_kernel(T* dx, float* partial, const T* dout, const T* x, const T* weight,
                                        const float* rstd, int N, int H, int R) {
  extern __shared__ float sums[];  // [warps][H]
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  float* dw = sums + threadIdx.x / 32 * H;
  for (int c = lane; c < H; c += 32) dw[c] = 0.0f;
  const int begin = blockIdx.x * R, end = min(N, begin + R);
  for (int row = begin + threadIdx.x / 32; row < end; row += warps) {
    const T* xr = x + int64_t{row} * H;
    const T* d = dout + int64_t{row} * H;
    const float s = rstd[row];
    float dot = 0.0f;
    for (int c = lane; c < H; c += 32) {
      dot += static_cast<float>(weight[c]) * static_cast<float>(d[c]) * static_cast<float>(xr[c]);
    }
    const float mean_dnorm_x = warp_sum(dot) / static_cast<float>(H);
    T* di = dx + int64_t{row} * H;
    for (int c = lane; c < H; c += 32) {
      const float xv = static_cast<float>(xr[c]), dv = static_cast<float>(d[c]);
      dw[c] += dv * xv * s;
      di[c] = static_cast<T>(static_cast<float>(di[c]) +
                             s * (static_cast<float>(weight[c]) * dv - xv * s * s * mean_dnorm_x));
    }
  }
  __syncthreads();
  float* part = partial + int64_t{blockIdx.x} * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += sums[w * H + c];
    part[c] = total;
  }
}

// A thread per channel pair (row, head, i): (x_i, x_{i+D/2}) turned by the angle at the row's
// position, `direction` -1 turning back.
template <typename T>
__global__ void rope_kernel(T* x, const float* cos, const float* sin, int64_t N, int S, int heads, int D,
                            float direction) {
  const int half = D / 2;
  const int64_t total = N * heads * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t head_row = idx / half;  // row * heads + head: heads of a row are adjacent
    const int t = static_cast<int>((head_row / heads) % S);
    const float c = cos[int64_t{t} * half + i], s = direction * sin[int64_t{t} * half + i];
    T* v = x + head_row * D;
    const float a = static_cast<float>(v[i]), b = static_cast<float>(v[i + half]);
    v[i] = static_cast<T>(a * c - b * s);
    v[i + half] = static_cast<T>(b * c + a * s);
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = static_cast<float>(gate[i]);
    out[i] = static_cast<T>(g / (1.0f + expf(-g)) * static_cast<float>(up[i]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = static_cast<float>(gate[i]), u = static_cast<float>(up[i]), d = static_cast<float>(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    dup[i] = static_cast<T>(d * g * sig);
    dgate[i] = static_cast<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

template <typename T>
void rope(T* x, const float* cos, const float* sin, int B, int S, int heads, int D, float direction, cudaStream_t st) {
  const int64_t N = int64_t{B} * S;
  if (N == 0) return;
  rope_kernel<<<blocks_for(N * heads * (D / 2), 256), 256, 0, st>>>(x, cos, sin, N, S, heads, D, direction);
  check_launch();
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* inputs, const T* embed, int N, int H, cudaStream_t st) {
  if (N == 0) return;
  embedding_forward_kernel<<<blocks_for(int64_t{N} * H, 256), 256, 0, st>>>(out, inputs, embed, N, H);
  check_launch();
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* weight, int N, int H, float eps, cudaStream_t st) {
  if (N == 0) return;
  rmsnorm_forward_kernel<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kRowsPerBlock * 32, 0, st>>>(out, rstd, x, weight,
                                                                                                 N, H, eps);
  check_launch();
}

template <typename T>
void rmsnorm_backward(T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd, int N,
                      int H, float* scratch, cudaStream_t st) {
  if (H > kRmsNormMaxChannels) {
    fail(ErrorKind::kInvalidInput, "CUDA RMSNorm backward supports at most " + std::to_string(kRmsNormMaxChannels) +
                                       " channels, not " + std::to_string(H));
  }
  if (N == 0) return;
  const int rows = (N + kRmsNormBlocks - 1) / kRmsNormBlocks;
  const int blocks = (N + rows - 1) / rows;
  // Up to 8 warps, as many as 48 KiB of shared memory hold sums for; wider rows get fewer warps, and
  // past 12288 channels one warp with the shared memory limit raised for it.
  const size_t warp_bytes = sizeof(float) * static_cast<size_t>(H);
  const int warps = static_cast<int>(std::clamp<size_t>((size_t{48} << 10) / warp_bytes, 1, 8));
  const size_t bytes = warps * warp_bytes;
  if (bytes > (size_t{48} << 10)) {
    CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
  }
  rmsnorm_backward_kernel<<<blocks, warps * 32, bytes, st>>>(dx, scratch, dout, x, weight, rstd, N, H, rows);
  check_launch();
  add_column_sums(dweight, scratch, blocks, H, st);
}

template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int B, int S, int heads, int D, cudaStream_t st) {
  rope(x, cos, sin, B, S, heads, D, 1.0f, st);
}

template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int B, int S, int heads, int D, cudaStream_t st) {
  rope(dx, cos, sin, B, S, heads, D, -1.0f, st);
}

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n, 256), 256, 0, st>>>(out, gate, up, n);
  check_launch();
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n, 256), 256, 0, st>>>(dgate, dup, dout, gate, up, n);
  check_launch();
}

#define SHARDKIT_INSTANTIATE(T)                                                                               \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, cudaStream_t);                   \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t);            \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, int, float*, \
                                    cudaStream_t);                                                            \
  template void rope_forward<T>(T*, const float*, const float*, int, int, int, int, cudaStream_t);            \
  template void rope_backward<T>(T*, const float*, const float*, int, int, int, int, cudaStream_t);           \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                             \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, cudaStream_t);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::llama
