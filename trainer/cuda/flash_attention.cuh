// Causal attention on tensor cores for 16-bit activations (bf16, fp16), in the manner of
// FlashAttention-2: scores and probabilities live in mma.sync fragments, one warp owns 16 rows, and
// only the log-sum-exp of each query row is kept for the backward pass. The backward pass runs two
// kernels (dq by query tile, dk/dv by key tile) instead of atomics on dq, so results are
// deterministic. Layout: qkv (B, S, 3C) with heads of HS = C/NH channels; out, dout (B, S, C);
// lse, delta (B, NH, S). Head sizes 32, 64 and 128.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace shardkit::trainer::cuda {

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int S, int C, int NH, cudaStream_t st);

// dqkv (B, S, 3C) overwritten; delta (B, NH, S) is scratch: rowsum(dout * out) of each query, computed
// by the dq kernel as it loads dout and read back by the dk/dv kernel.
template <typename T>
void flash_attention_backward(T* dqkv, float* delta, const T* dout, const T* out, const T* qkv, const float* lse, int B,
                              int S, int C, int NH, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
