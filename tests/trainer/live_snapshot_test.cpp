// The host-memory snapshot's room rule and the gate that holds the optimizer step while a save reads
// live states.
#include "trainer/live_snapshot.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace shardkit::trainer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(LiveSnapshot, AHostCopyFitsWhenEveryRankOfTheNodeHasOneAndHeadroomRemains) {
  // 128 GiB node: the headroom is a tenth, 12.8 GiB.
  EXPECT_TRUE(host_copy_fits(20 * kGiB, 2, 60 * kGiB, 128 * kGiB));
  EXPECT_FALSE(host_copy_fits(20 * kGiB, 3, 60 * kGiB, 128 * kGiB)) << "three ranks' copies leave no headroom";
  EXPECT_FALSE(host_copy_fits(80 * kGiB, 1, 90 * kGiB, 128 * kGiB)) << "a 6.65 B model's states on a 128 GiB host";
  // A small machine keeps at least 2 GiB.
  EXPECT_TRUE(host_copy_fits(kGiB, 1, 3 * kGiB, 4 * kGiB));
  EXPECT_FALSE(host_copy_fits(kGiB + 1, 1, 3 * kGiB, 4 * kGiB));
}

TEST(LiveSnapshot, TheGateHoldsTheStepUntilTheSaveIsDoneAndSaysHowLong) {
  SnapshotGate gate;
  gate.wait_open();  // open: no wait
  EXPECT_EQ(gate.waited_ms(), 0.0);
  gate.close();
  std::atomic<bool> stepped = false;
  std::thread step([&] {
    gate.wait_open();
    stepped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(stepped) << "the step went on while the save held the states";
  gate.open();
  step.join();
  EXPECT_TRUE(stepped);
  EXPECT_GE(gate.waited_ms(), 90.0);
  gate.close();  // the next save starts counting afresh
  EXPECT_EQ(gate.waited_ms(), 0.0);
  gate.open();
}

}  // namespace
}  // namespace shardkit::trainer
