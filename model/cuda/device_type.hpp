// What each library calls the compute types: T = float, __nv_bfloat16 or __half, in one place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include "ckpt/tensor_table.hpp"

namespace shardkit::model::cuda {

template <typename T>
struct DeviceType;

template <>
struct DeviceType<float> {
  static constexpr cudaDataType_t kCuda = CUDA_R_32F;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kF32;  // the host's fp32 weights as they are
  static constexpr const char* kName = "fp32";
};

template <>
struct DeviceType<__nv_bfloat16> {
  static constexpr cudaDataType_t kCuda = CUDA_R_16BF;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kBF16;
  static constexpr const char* kName = "bf16";
};

template <>
struct DeviceType<__half> {
  static constexpr cudaDataType_t kCuda = CUDA_R_16F;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kF16;
  static constexpr const char* kName = "fp16";
};

}  // namespace shardkit::model::cuda
