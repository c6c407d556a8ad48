// The CUDA tests' skip: a test that needs GPUs reports how many it needs and how many it sees, and
// passes as skipped where there are too few (the CI machine has none).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace shardkit::testing {

// CUDA devices visible to this process; 0 where the runtime finds no driver or device.
inline int visible_gpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

}  // namespace shardkit::testing

// Skips the current test unless device 0 has compute capability 9.0, the one the sm_90a code of the
// Hopper kernels runs on.
#define REQUIRE_SM90()                                                                                                \
  do {                                                                                                                \
    REQUIRE_GPUS(1);                                                                                                  \
    int major_ = 0, minor_ = 0;                                                                                       \
    if (cudaDeviceGetAttribute(&major_, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||                       \
        cudaDeviceGetAttribute(&minor_, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess || major_ != 9 ||        \
        minor_ != 0) {                                                                                                \
      GTEST_SKIP() << "needs a compute capability 9.0 device (sm_90a code), device 0 is " << major_ << "." << minor_; \
    }                                                                                                                 \
  } while (0)

// Skips the current test unless `needed` CUDA devices are visible.
#define REQUIRE_GPUS(needed)                                                                             \
  do {                                                                                                   \
    if (::shardkit::testing::visible_gpus() < (needed)) {                                                \
      GTEST_SKIP() << "needs " << (needed) << " CUDA device(s), " << ::shardkit::testing::visible_gpus() \
                   << " visible";                                                                        \
    }                                                                                                    \
  } while (0)
