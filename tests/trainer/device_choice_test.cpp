// `eval --device auto`: the GPU only where the build has CUDA and the rank has a GPU of its own; cpu and
// cuda as asked. The probe of this process in a build without CUDA never reports a GPU.
#include "trainer/device_choice.hpp"

#include <gtest/gtest.h>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

TEST(DeviceChoice, AutoTakesTheGpuOnlyWithCudaAndAGpuForTheRank) {
  const GpuProbe built_two{true, 2, ""};
  EXPECT_EQ(choose_device("auto", built_two, 0).cuda, true);
  EXPECT_EQ(choose_device("auto", built_two, 0).reason, "auto: 2 GPUs visible");
  EXPECT_EQ(choose_device("auto", built_two, 1).cuda, true);
  // A third rank on the node has no GPU of its own.
  EXPECT_EQ(choose_device("auto", built_two, 2).cuda, false);
  EXPECT_EQ(choose_device("auto", built_two, 2).reason, "auto: 2 GPUs visible, fewer than the ranks of a node");
  // A build without CUDA, whatever the machine holds.
  const DeviceChoice no_cuda = choose_device("auto", GpuProbe{false, 8, ""}, 0);
  EXPECT_FALSE(no_cuda.cuda);
  EXPECT_EQ(no_cuda.reason, "auto: this shardkit was built without CUDA");
  // CUDA built, but the driver shows no GPU, or cannot be loaded.
  EXPECT_FALSE(choose_device("auto", GpuProbe{true, 0, ""}, 0).cuda);
  const DeviceChoice no_driver = choose_device("auto", GpuProbe{true, 0, "no CUDA driver (libcuda.so.1 not found)"}, 0);
  EXPECT_FALSE(no_driver.cuda);
  EXPECT_EQ(no_driver.reason, "auto: no GPU visible (no CUDA driver (libcuda.so.1 not found))");
}

TEST(DeviceChoice, CpuAndCudaAreTakenAsAsked) {
  EXPECT_FALSE(choose_device("cpu", GpuProbe{true, 4, ""}, 0).cuda);
  // cuda without a GPU is the backend's to refuse, with its own message.
  EXPECT_TRUE(choose_device("cuda", GpuProbe{false, 0, ""}, 0).cuda);
  EXPECT_EQ(choose_device("cuda", GpuProbe{}, 0).reason, "--device cuda");
  EXPECT_THROW(choose_device("gpu", GpuProbe{}, 0), Error);
}

TEST(DeviceChoice, TheProbeOfThisProcessMatchesTheBuild) {
  const GpuProbe probe = probe_gpus();
  EXPECT_EQ(probe.built_with_cuda, SHARDKIT_TEST_BUILT_WITH_CUDA != 0);
  if (!probe.built_with_cuda) {
    EXPECT_EQ(probe.visible_gpus, 0);
    EXPECT_FALSE(choose_device("auto", probe, 0).cuda);
  }
}

}  // namespace
}  // namespace shardkit::trainer
