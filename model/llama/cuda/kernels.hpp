// The Llama family's own CUDA kernels (the ones it shares with GPT-2 are model/cuda's): token
// embedding, rotary position embedding and SwiGLU, as host launchers on an explicit stream.
// T is float, __nv_bfloat16 or __half; arithmetic in fp32; parameter gradients fp32. Rows are N =
// B * S tokens, row-major and contiguous. They compute what model/llama/cpu_ops.hpp's fp32 kernels do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace shardkit::model::llama {

// out (N, H) = embed[inputs]. Its backward pass is model/cuda's EncoderBackward without positions.
template <typename T>
void embedding_forward(T* out, const int32_t* inputs, const T* embed, int N, int H, cudaStream_t st);

// Rotates, in place, each head (`heads` heads of D channels per row, rows of B sequences of S tokens)
// by its position's angles: channel pairs (i, i + D/2) turn by the angle whose cosine and sine are
// cos, sin (S, D/2) at [t, i]. rope_backward turns them back (the gradient of rope_forward).
template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int B, int S, int heads, int D, cudaStream_t st);
template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int B, int S, int heads, int D, cudaStream_t st);

// out = silu(gate) * up over n elements.
template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t st);
// dgate, dup overwritten; dgate may be dout (each element is read before it is written).
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, cudaStream_t st);

}  // namespace shardkit::model::llama
