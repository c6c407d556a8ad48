// The optimizer's update kernels on the GPU, as host launchers that take an explicit stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/adamw.hpp"

namespace shardkit::trainer::cuda {

// AdamW on fp32 master weights and moments (trainer/adamw.hpp gives the formula), one launch,
// without weight decay on the elements `no_decay` names (its table in device memory); `params` (may
// be null) receives the updated weights in T.
template <typename T>
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, T* params, int64_t n,
           const AdamWCoefficients& c, NoDecayRanges no_decay, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
