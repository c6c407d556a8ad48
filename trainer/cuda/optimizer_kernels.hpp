// The optimizers' update kernels on the GPU, as host launchers that take an explicit stream, and the
// dispatch by the step's optimizer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "trainer/adamw.hpp"
#include "trainer/lion.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer::cuda {

// AdamW on fp32 master weights and moments (trainer/adamw.hpp gives the formula), one launch,
// without weight decay on the elements `no_decay` names (its table in device memory); `params` (may
// be null) receives the updated weights in T.
template <typename T>
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, T* params, int64_t n,
           const AdamWCoefficients& c, NoDecayRanges no_decay, cudaStream_t st);

// Lion on fp32 master weights and its moment (trainer/lion.hpp gives the formula), as adamw.
template <typename T>
void lion(float* master, float* exp_avg, const float* grad, T* params, int64_t n, const LionCoefficients& c,
          NoDecayRanges no_decay, cudaStream_t st);

// The update of `step`'s optimizer over [0, n) of the optimizer view: `states` its states' device
// pointers in its descriptor's order (trainer/optimizer.hpp), `params` (may be null) the updated
// weights in T.
template <typename T>
void optimizer_update(const OptimizerStep& step, std::span<float* const> states, const float* grad, T* params,
                      int64_t n, NoDecayRanges no_decay, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
