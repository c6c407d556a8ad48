// GPT-2's own CUDA kernels, as host launchers on an explicit stream: the embeddings with learned
// positions, and attention over the packed q|k|v rows of its c_attn product. T is float,
// __nv_bfloat16 or __half; arithmetic in fp32. Shapes as in model/cuda/kernels.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardkit::model::gpt2 {

// out (N, C) = wte[inputs] + wpe[s]. Its backward pass: model/cuda/encoder_backward.hpp.
template <typename T>
void encoder_forward(T* out, const int32_t* inputs, const T* wte, const T* wpe, int B, int S, int C, cudaStream_t st);

// Causal multi-head attention over the packed layout: qkv (B, S, 3C) -> out (B, S, C), C = NH * head
// size; dqkv (B, S, 3C). lse and delta as model/cuda's attention takes them.
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int S, int C, int NH, cudaStream_t st);
template <typename T>
void attention_backward(T* dqkv, float* delta, const T* dout, const T* out, const T* qkv, const float* lse, int B,
                        int S, int C, int NH, cudaStream_t st);

}  // namespace shardkit::model::gpt2
