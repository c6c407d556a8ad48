// The Llama family's own CUDA kernels (the ones it shares with GPT-2 are model/cuda's): token
// embedding, rotary position embedding and SwiGLU, as host launchers on an explicit stream.
// T is float, __nv_bfloat16 or __half; arithmetic in fp32; parameter gradients fp32. Rows are N =
// B * S tokens, row-major. They compute what model/llama/cpu_ops.hpp's fp32 kernels do.
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

// Rotates, in place, each head of the first `heads` heads of D channels in each row (rows `ld`
// elements apart, of B sequences of S tokens) by its position's angles: channel pairs (i, i + D/2)
// turn by the angle whose cosine and sine are cos, sin (S, D/2) at [t, i]. rope_backward turns them
// back (the gradient of rope_forward). A row of packed q|k|v turns its q and k heads in one call.
template <typename T>
void rope_forward(T* x, int64_t ld, const float* cos, const float* sin, int B, int S, int heads, int D,
                  cudaStream_t st);
template <typename T>
void rope_backward(T* dx, int64_t ld, const float* cos, const float* sin, int B, int S, int heads, int D,
                   cudaStream_t st);

// out (N, I) = silu(gate) * up, where each row of gate_up (N, 2I) holds the row's gate, then its up
// (the output of one product with the two weights stacked).
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int I, cudaStream_t st);
// d(gate) and d(up) into the halves of each row of dgate_up (N, 2I), from dout (N, I, row stride
// ld_dout) and gate_up. dout may be dgate_up's up half (dgate_up + I, ld_dout 2I): each element is
// read before it is written.
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, int64_t ld_dout, const T* gate_up, int N, int I, cudaStream_t st);

}  // namespace shardkit::model::llama
