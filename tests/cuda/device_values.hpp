// Host-side data for the CUDA kernel tests: random values rounded to a 16-bit type (kept both ways),
// device buffers filled from and read back into vectors, and the error measure the tests compare with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
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
    const double d = std::abs(double{got[i]} - double{want[i]});
    if (std::isnan(d)) return d;  // no tolerance passes it (std::max would drop it)
    err = std::max(err, d);
    scale = std::max(scale, std::abs(double{want[i]}));
  }
  return err / std::max(scale, 1e-30);
}

// Waits up to `seconds` for the work queued so far on the default stream. Past that, says which work
// (`what`) never finished and ends the process: a kernel stuck on a barrier that never completes
// would otherwise hold the test until ctest's timeout, and the device with it. (ctest runs each test
// in a process of its own, so the next test starts on a fresh context.)
inline void finish_within(double seconds, const std::string& what) {
  cudaEvent_t done = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(done, nullptr));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  cudaError_t status = cudaEventQuery(done);
  while (status == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    status = cudaEventQuery(done);
  }
  if (status == cudaErrorNotReady) {
    std::fprintf(stderr, "%s did not finish within %.0f s: a kernel is stuck; ending the test process\n", what.c_str(),
                 seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
  CUDA_CHECK(cudaEventDestroy(done));
  CUDA_CHECK(status);
}

}  // namespace shardkit::testing
