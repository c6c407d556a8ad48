// Device-side element conversions and packed accesses shared by the kernel files: fp32 arithmetic on
// float, bf16 and fp16 storage, and W adjacent elements moved as one access (16 bytes by default, the
// widest load a thread issues).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace shardkit::model::cuda {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// W adjacent values of T, aligned to their size so that a load or store is one instruction; the
// address must be so aligned.
template <typename T, int W = 16 / sizeof(T)>
struct alignas(sizeof(T) * W) Vec {
  static constexpr int kSize = W;
  T v[W];
};
template <int W, typename T>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, W>*>(p);
}
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  return load_vec<Vec<T>::kSize>(p);
}
template <typename T, int W>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, W>& x) {
  *reinterpret_cast<Vec<T, W>*>(p) = x;
}

// Calls launch(std::integral_constant<int, W>{}) with the widest pack W that rows or runs of `count`
// elements and the pointers allow: 16 bytes of T where count is a multiple of it and every pointer is
// 16-byte aligned, else one element.
template <typename T, typename Launch, typename... P>
void with_pack_width(int64_t count, Launch&& launch, const P*... pointers) {
  constexpr int kVec = Vec<T>::kSize;
  if (count % kVec == 0 && ((reinterpret_cast<uintptr_t>(pointers) % 16 == 0) && ...)) {
    launch(std::integral_constant<int, kVec>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

}  // namespace shardkit::model::cuda
