#include "model/gpt2/cuda/kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"

namespace shardkit::model::gpt2 {
namespace {

using cuda::blocks_for;
using cuda::check_launch;
using cuda::from_float;
using cuda::to_float;

template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* inputs, const T* wte, const T* wpe, int N, int S, int C) {
  const int64_t total = int64_t{N} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int s = static_cast<int>(n % S);
    out[i] = from_float<T>(to_float(wte[int64_t{inputs[n]} * C + c]) + to_float(wpe[int64_t{s} * C + c]));
  }
}

// q, k and v of a row are its thirds: C channels each, rows 3C apart.
cuda::AttentionShape packed(int B, int S, int C, int NH) {
  return {B, S, NH, NH, C / NH, 3 * int64_t{C}, 3 * int64_t{C}};
}

}  // namespace

template <typename T>
void encoder_forward(T* out, const int32_t* inputs, const T* wte, const T* wpe, int B, int S, int C, cudaStream_t st) {
  encoder_forward_kernel<<<blocks_for(int64_t{B} * S * C, 256), 256, 0, st>>>(out, inputs, wte, wpe, B * S, S, C);
  check_launch();
}

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int S, int C, int NH, cudaStream_t st) {
  cuda::attention_forward(out, lse, qkv, qkv + C, qkv + 2 * C, packed(B, S, C, NH), st);
}

template <typename T>
void attention_backward(T* dqkv, float* delta, const T* dout, const T* out, const T* qkv, const float* lse, int B,
                        int S, int C, int NH, cudaStream_t st) {
  cuda::attention_backward(dqkv, dqkv + C, dqkv + 2 * C, delta, dout, out, qkv, qkv + C, qkv + 2 * C, lse,
                           packed(B, S, C, NH), st);
}

#define SHARDKIT_INSTANTIATE(T)                                                                                   \
  template void encoder_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, cudaStream_t);          \
  template void attention_forward<T>(T*, float*, const T*, int, int, int, int, cudaStream_t);                     \
  template void attention_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, int, int, int, \
                                      cudaStream_t);

SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::gpt2
