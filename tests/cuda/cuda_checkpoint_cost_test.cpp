// What a save costs training on a GPU, measured rather than assumed, on both snapshot paths: staged
// (the compute stream copies the states into device memory, a side stream drains that to host
// memory) and direct (the side stream copies to host memory beside the next micro-batches, and the
// next optimizer step waits for it). A copy made slower by a known delay (SHARDKIT_FAULT=slow-snapshot:
// a spinning kernel on the copy's stream) must show in device_wait_ms and training_lost_ms, and not in
// the time save() held the loop. And a staged snapshot must save exactly the states of its step.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

class CudaCheckpointCost : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaCheckpointCost, ASlowSnapshotCopyIsTimeTheDeviceWaitedAndTrainingLost) {
  REQUIRE_GPUS(1);
  const std::string staging = GetParam();
  testing::TempDir dir;
  const double delay_ms = 700;
  const Result r =
      run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " +
              write_text_tokens(dir).string() + " --steps 6 --save-interval 2 --save-dir " + (dir / "run").string() +
              " --metrics " + (dir / "m.jsonl").string() + " --snapshot-staging " + staging,
          "timeout -s KILL 180 " + mpirun(1),
          "SHARDKIT_FAULT=slow-snapshot SHARDKIT_FAULT_STEP=4 SHARDKIT_FAULT_DELAY_MS=700");
  ASSERT_EQ(r.code, 0) << r.err;
  const bool staged = staging == "device";
  EXPECT_NE(
      (r.out + r.err)
          .find(staged ? "checkpoint snapshots: staged in GPU memory" : "copied from GPU to host memory directly"),
      std::string::npos)
      << r.out;
  EXPECT_EQ((r.out + r.err).find("snapshot staging ") != std::string::npos, staged) << "the memory line: " << r.out;
  const auto events = read_metrics(dir / "m.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  for (const auto& e : events) ASSERT_EQ(e["event"], "checkpoint") << e.dump();
  const auto& slow = events[1];
  EXPECT_EQ(slow["step"], 4);
  // Direct: the forward and backward passes of gpt2-tiny overlap a few milliseconds of the delay at
  // most. Staged: the delay is on the training stream itself.
  EXPECT_GT(slow["device_wait_ms"].get<double>(), 0.8 * delay_ms) << slow.dump();
  EXPECT_LT(slow["device_wait_ms"].get<double>(), 1.2 * delay_ms) << slow.dump();
  EXPECT_LT(slow["loop_blocked_ms"].get<double>(), 0.2 * delay_ms) << "the copy is asynchronous: " << slow.dump();
  EXPECT_DOUBLE_EQ(slow["training_lost_ms"].get<double>(),
                   slow["loop_blocked_ms"].get<double>() + slow["device_wait_ms"].get<double>());
  EXPECT_LT(events[0]["device_wait_ms"].get<double>(), 0.2 * delay_ms) << events[0].dump();
}

INSTANTIATE_TEST_SUITE_P(Staging, CudaCheckpointCost, ::testing::Values("device", "host"),
                         [](const auto& param_info) { return std::string(param_info.param); });

// A save every step, so that each staged copy may find the previous drain still reading the staging
// buffer: the checkpoint of step 4, resumed, continues the uninterrupted run bit for bit (same world
// size and stage), so it holds exactly step 4's states.
TEST(CudaSnapshotStaging, AStagedSnapshotHoldsExactlyItsStepsStates) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string common = "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " +
                             data + " --steps 6 --snapshot-staging device --save-dir ";
  const Result full = run(common + (dir / "a").string() + " --save-interval 1 --metrics " + (dir / "a.jsonl").string(),
                          "timeout -s KILL 180 " + mpirun(1));
  ASSERT_EQ(full.code, 0) << full.err;
  const Result resumed = run(common + (dir / "b").string() + " --resume " + (dir / "a" / "step-00000004").string() +
                                 " --metrics " + (dir / "b.jsonl").string(),
                             "timeout -s KILL 180 " + mpirun(1));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const auto a = read_metrics(dir / "a.jsonl"), b = read_metrics(dir / "b.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i]["step"], a[4 + i]["step"]);
    EXPECT_EQ(b[i]["loss"].get<double>(), a[4 + i]["loss"].get<double>()) << "step " << b[i]["step"];
    EXPECT_EQ(b[i]["grad_norm"].get<double>(), a[4 + i]["grad_norm"].get<double>()) << "step " << b[i]["step"];
  }
}

}  // namespace
}  // namespace shardkit
