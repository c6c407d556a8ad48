// LayerNorm and RMSNorm over rows of C channels, forward and backward, for every model family, as host
// launchers on an explicit stream. T is float, __nv_bfloat16 or __half; arithmetic in fp32; the saved
// statistics and parameter gradients are fp32. Rows are N tokens, row-major and contiguous.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "model/cuda/kernels.hpp"

namespace shardkit::model::cuda {

enum class Norm { kLayer, kRms };

// Why these kernels cannot normalise rows of `channels` (the config field `field`, named in the
// message), "" when they can: the backward pass holds a warp's weight-gradient sums in shared memory.
std::string norm_unsupported(Norm norm, const std::string& field, int channels);

// The backward passes add per-block partial sums (kNormBlocks blocks of rows) in a fixed order, so
// the weight and bias gradients have the same bits on every run; `scratch` holds norm_scratch_floats.
constexpr int kNormBlocks = 512;
constexpr int64_t norm_scratch_floats(Norm norm, int C) {
  return int64_t{kNormBlocks} * (norm == Norm::kLayer ? 2 : 1) * C;
}

// LayerNorm (eps 1e-5): out = (x - mean) * rstd * weight + bias; mean, rstd (N) saved.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t st);
// dinp (N, C) += the input gradient; dweight, dbias (C) += (kStore: =) theirs.
template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, float* scratch, GradWrite write,
                        cudaStream_t st);

// RMSNorm: out = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), saved (N).
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* weight, int N, int C, float eps, cudaStream_t st);
// dx (N, C) += the input gradient; dweight (C) += (kStore: =) the weight gradient.
template <typename T>
void rmsnorm_backward(T* dx, float* dweight, const T* dout, const T* x, const T* weight, const float* rstd, int N,
                      int C, float* scratch, GradWrite write, cudaStream_t st);

}  // namespace shardkit::model::cuda
