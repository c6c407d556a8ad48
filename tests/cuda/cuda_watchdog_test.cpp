// The NCCL watchdog's failure paths, through the command line as a user meets them: one of two GPU
// ranks stops taking part in the step's collectives, so the other's reduce-scatter never completes.
// Stalled (SHARDKIT_FAULT=stall: alive, sleeping), the waiting rank must notice within
// SHARDKIT_COLLECTIVE_TIMEOUT, abort its communicator and end the whole job with a message; killed
// (SHARDKIT_FAULT=step-kill: SIGKILL), the job must end with an error too. Never a hang. Skipped
// without 2 GPUs.
#include <gtest/gtest.h>

#include <chrono>

#include "ckpt/run_dir.hpp"
#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

// 6 steps of gpt2-tiny on GPUs, a synchronous checkpoint every 2 steps.
std::string train_args(const std::filesystem::path& data, const std::filesystem::path& run_dir) {
  return "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " + data.string() +
         " --steps 6 --save-interval 2 --save-mode sync --save-dir " + run_dir.string();
}

TEST(CudaWatchdog, ARankStalledOutsideTheCollectivesEndsTheJobWithinTheTimeout) {
  REQUIRE_GPUS(2);
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const auto start = std::chrono::steady_clock::now();
  // `timeout` only guards the test itself against the hang it looks for.
  const Result r =
      run(train_args(data, dir / "run"), "timeout -s KILL 240 " + mpirun(2),
          "SHARDKIT_FAULT=stall SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=4 SHARDKIT_COLLECTIVE_TIMEOUT=15");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 137) << "the job hung until the test's own timeout killed it";
  EXPECT_NE(r.err.find("no progress on the GPU for 15 s (SHARDKIT_COLLECTIVE_TIMEOUT)"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 120.0);
  EXPECT_EQ(ckpt::read_latest(dir / "run").value_or(""), "step-00000002")
      << "the checkpoint before the stall is intact";
}

TEST(CudaWatchdog, ARankKilledMidRunEndsTheJobWithAnError) {
  REQUIRE_GPUS(2);
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const auto start = std::chrono::steady_clock::now();
  // The older name of the timeout, still honoured: the backstop should nothing else notice the death.
  const Result r = run(train_args(data, dir / "run"), "timeout -s KILL 240 " + mpirun(2),
                       "SHARDKIT_FAULT=step-kill SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=4 SHARDKIT_NCCL_TIMEOUT=30");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0) << "the fault did not fire";
  // (mpirun passes the killed rank's status on, 137 as `timeout` would: the time tells them apart.)
  EXPECT_LT(seconds, 120.0) << "the job hung until the test's own timeout killed it";
  EXPECT_EQ(ckpt::read_latest(dir / "run").value_or(""), "step-00000002") << "the checkpoint before the kill is intact";
}

}  // namespace
}  // namespace shardkit
