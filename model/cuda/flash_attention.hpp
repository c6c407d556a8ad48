// Causal attention on tensor cores for 16-bit activations (bf16, fp16), in the manner of
// FlashAttention-2: scores and probabilities live in mma.sync fragments, one warp owns 16 rows, and
// only the log-sum-exp of each query row is kept for the backward pass. The backward pass runs two
// kernels (dq by query tile, dk/dv by key tile) instead of atomics on dq, so results are
// deterministic. Operands as AttentionShape (kernels.hpp) describes them: separate or packed q, k, v,
// grouped-query heads (the dk/dv kernel owns a kv head's key tile and walks the query tiles of every
// head that reads it, summing them in head order). Head sizes 32, 64 and 128.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "model/cuda/kernels.hpp"

namespace shardkit::model::cuda {

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& shape,
                             cudaStream_t st);

// dq, dk, dv overwritten at their rows' positions; delta (B, NH, S) is scratch: rowsum(dout * out) of
// each query, computed by the dq kernel as it loads dout and read back by the dk/dv kernel.
template <typename T>
void flash_attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                              const T* v, const float* lse, const AttentionShape& shape, cudaStream_t st);

}  // namespace shardkit::model::cuda
