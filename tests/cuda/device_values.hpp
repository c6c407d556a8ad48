// Host-side data for the CUDA kernel tests: random values rounded to a 16-bit type (kept both ways),
// device buffers filled from and read back into vectors, and the error measure the tests compare with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::testing {

using model::cuda::DeviceBuffer;

template <typename T>
T to(float x);
template <>
inline float to<float>(float x) {
  return x;
}
template <>
inline __nv_bfloat16 to<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
inline __half to<__half>(float x) {
  return __float2half_rn(x);
}
inline float from(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
inline float from(__half x) {
  return __half2float(x);
}
inline float from(float x) {
  return x;
}

// Random values rounded to T, returned both as T and as the exact floats they represent.
template <typename T>
void random_values(size_t n, float stddev, uint32_t seed, std::vector<T>& as_t, std::vector<float>& as_float) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  as_t.resize(n);
  as_float.resize(n);
  for (size_t i = 0; i < n; ++i) {
    as_t[i] = to<T>(dist(rng));
    as_float[i] = from(as_t[i]);
  }
}

template <typename U>
DeviceBuffer<U> upload(const std::vector<U>& host) {
  DeviceBuffer<U> d(host.size());
  CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(U), cudaMemcpyHostToDevice));
  return d;
}

// (cudaMemcpy waits for the work queued on the default stream, which the tests' kernels run on.)
template <typename U>
std::vector<U> download(const DeviceBuffer<U>& d) {
  std::vector<U> host(d.size());
  CUDA_CHECK(cudaMemcpy(host.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

template <typename T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), [](T v) { return from(v); });
  return out;
}

// Largest |got - want| relative to the largest |want|: 16-bit outputs carry about 3 significant digits.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err = std::max(err, std::abs(double{got[i]} - double{want[i]}));
    scale = std::max(scale, std::abs(double{want[i]}));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace shardkit::testing
