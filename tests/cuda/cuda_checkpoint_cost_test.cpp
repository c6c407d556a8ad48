// What a save costs training on a GPU, measured rather than assumed: the snapshot's copy to host
// memory runs beside the next micro-batches, and the next optimizer step waits for it on the device.
// A copy made slower by a known delay (SHARDKIT_FAULT=slow-snapshot: a spinning kernel on the copy's
// stream) must show in device_wait_ms and training_lost_ms, and not in the time save() held the loop.
#include <gtest/gtest.h>

#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

TEST(CudaCheckpointCost, ASlowSnapshotCopyIsTimeTheDeviceWaitedAndTrainingLost) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  const double delay_ms = 700;
  const Result r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " +
                           write_text_tokens(dir).string() + " --steps 6 --save-interval 2 --save-dir " +
                           (dir / "run").string() + " --metrics " + (dir / "m.jsonl").string(),
                       "timeout -s KILL 180 " + mpirun(1),
                       "SHARDKIT_FAULT=slow-snapshot SHARDKIT_FAULT_STEP=4 SHARDKIT_FAULT_DELAY_MS=700");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto events = read_metrics(dir / "m.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  for (const auto& e : events) ASSERT_EQ(e["event"], "checkpoint") << e.dump();
  const auto& slow = events[1];
  EXPECT_EQ(slow["step"], 4);
  // The forward and backward passes of gpt2-tiny overlap a few milliseconds of the delay at most.
  EXPECT_GT(slow["device_wait_ms"].get<double>(), 0.8 * delay_ms) << slow.dump();
  EXPECT_LT(slow["device_wait_ms"].get<double>(), 1.2 * delay_ms) << slow.dump();
  EXPECT_LT(slow["loop_blocked_ms"].get<double>(), 0.2 * delay_ms) << "the copy is asynchronous: " << slow.dump();
  EXPECT_DOUBLE_EQ(slow["training_lost_ms"].get<double>(),
                   slow["loop_blocked_ms"].get<double>() + slow["device_wait_ms"].get<double>());
  EXPECT_LT(events[0]["device_wait_ms"].get<double>(), 0.2 * delay_ms) << events[0].dump();
}

}  // namespace
}  // namespace shardkit
