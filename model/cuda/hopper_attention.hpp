// Causal attention for Hopper (compute capability 9.0) in the manner of FlashAttention-3: a producer
// warp streams tiles through shared memory with the copy engine, two consumer warpgroups of 64 rows
// each multiply on wgmma, and probabilities pass from one product's accumulators to the next product
// in registers. Operands and results exactly as flash_attention.hpp's (AttentionShape, kernels.hpp):
// separate or packed q, k, v, grouped-query heads, out and dout (B, S, NH * HS), lse and delta
// (B, NH, S); the backward pass in two kernels without atomics (the same bits every run). Head sizes
// 64 and 128.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "model/cuda/kernels.hpp"

namespace shardkit::model::cuda {

// Whether the sm_90 kernels take this call: the current device has compute capability 9.0, the head
// size is 64 or 128, and q, k, v (and dout, the backward pass's output gradient, when given) and their
// row strides are 16-byte aligned (the copy engine's rule). attention_kernels.hpp chooses between them
// and the mma.sync kernels.
bool hopper_attention_supports(const AttentionShape& shape, const void* q, const void* k, const void* v,
                               const void* dout = nullptr);

template <typename T>
void hopper_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& shape,
                              cudaStream_t st);
// dq, dk, dv overwritten at their rows' positions; delta (B, NH, S) is scratch, written by the first
// kernel and read by the second.
template <typename T>
void hopper_attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                               const T* v, const float* lse, const AttentionShape& shape, cudaStream_t st);

}  // namespace shardkit::model::cuda
