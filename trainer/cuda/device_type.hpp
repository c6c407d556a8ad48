// What each library calls the compute types: T = float, __nv_bfloat16 or __half, in one place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>
#include <nccl.h>

#include <cstring>
#include <span>
#include <type_traits>

#include "trainer/adamw.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
struct DeviceType;

template <>
struct DeviceType<float> {
  static constexpr cudaDataType_t kCuda = CUDA_R_32F;
  static constexpr ncclDataType_t kNccl = ncclFloat;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kF32;  // the host's fp32 weights as they are
  static constexpr const char* kName = "fp32";
};

template <>
struct DeviceType<__nv_bfloat16> {
  static constexpr cudaDataType_t kCuda = CUDA_R_16BF;
  static constexpr ncclDataType_t kNccl = ncclBfloat16;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kBF16;
  static constexpr const char* kName = "bf16";
};

template <>
struct DeviceType<__half> {
  static constexpr cudaDataType_t kCuda = CUDA_R_16F;
  static constexpr ncclDataType_t kNccl = ncclHalf;
  static constexpr ckpt::DType kNarrow = ckpt::DType::kF16;
  static constexpr const char* kName = "fp16";
};

// out = the fp32 weights in T (rounded to nearest even), on all threads.
template <typename T>
void narrow_into(std::span<const float> in, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(out, in.data(), in.size_bytes());
  } else {
    narrow_weights(in, DeviceType<T>::kNarrow, reinterpret_cast<uint16_t*>(out));
  }
}

}  // namespace shardkit::trainer::cuda
