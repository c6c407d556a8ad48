// Running out of GPU or page-locked host memory, the most common way a GPU run fails: an Error(kIo)
// (not an internal error) saying how much was asked and how much is free, after which the device is
// still usable. An allocation no machine can serve (4 PB) stands in for a model that does not fit.
// Skipped (with a message) without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "model/cuda/cuda_common.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

constexpr size_t kMoreThanAnyMachine = size_t{1} << 52;  // 4.50 PB

// The Error that `allocate` throws, or a failure.
template <typename Allocate>
std::string error_of(Allocate&& allocate) {
  try {
    allocate();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the allocation succeeded";
  return "";
}

TEST(CudaMemory, OutOfDeviceMemorySaysWhatWasAskedAndWhatIsFree) {
  REQUIRE_GPUS(1);
  const std::string message = error_of([] { DeviceBuffer<float> too_big(kMoreThanAnyMachine / sizeof(float)); });
  EXPECT_NE(message.find("out of GPU memory: 4.50 PB more asked of CUDA device 0 ("), std::string::npos) << message;
  EXPECT_NE(message.find(" free of "), std::string::npos) << message;
  EXPECT_NE(message.find("train_micro_batch_size_per_gpu"), std::string::npos) << message;
  // The failure left nothing behind: the device allocates and works, and no error is pending.
  DeviceBuffer<float> small(1024);
  EXPECT_EQ(cudaMemset(small.data(), 0, small.bytes()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaMemory, OutOfPinnedHostMemorySaysWhatWasAskedAndWhatIsFree) {
  REQUIRE_GPUS(1);
  PinnedBuffer<float> buffer(16);
  const std::string message = error_of([&] { buffer.resize(kMoreThanAnyMachine / sizeof(float)); });
  EXPECT_NE(message.find("out of page-locked host memory: 4.50 PB more asked, "), std::string::npos) << message;
  EXPECT_EQ(buffer.size(), 0u) << "a failed resize leaves an empty buffer, not a stale size";
  EXPECT_EQ(buffer.data(), nullptr);
}

}  // namespace
}  // namespace shardkit::trainer::cuda
