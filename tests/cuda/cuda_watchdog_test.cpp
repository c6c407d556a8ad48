// The NCCL watchdog's failure path, through the command line as a user meets it: one of two GPU ranks
// stops taking part in the step's collectives (SHARDKIT_FAULT=stall: alive, sleeping), so the other's
// reduce-scatter never completes. The waiting rank must notice within SHARDKIT_NCCL_TIMEOUT, abort its
// communicator and end the whole job with a message, instead of hanging it. Skipped without 2 GPUs.
#include <gtest/gtest.h>

#include <chrono>

#include "ckpt/run_dir.hpp"
#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

TEST(CudaWatchdog, ARankStalledOutsideTheCollectivesEndsTheJobWithinTheTimeout) {
  REQUIRE_GPUS(2);
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::string args = "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " +
                           data.string() + " --steps 6 --save-interval 2 --save-mode sync --save-dir " +
                           (dir / "run").string();
  const auto start = std::chrono::steady_clock::now();
  // `timeout` only guards the test itself against the hang it looks for.
  const Result r = run(args, "timeout -s KILL 240 " + mpirun(2),
                       "SHARDKIT_FAULT=stall SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=4 SHARDKIT_NCCL_TIMEOUT=5");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 137) << "the job hung until the test's own timeout killed it";
  EXPECT_NE(r.err.find("no progress on the GPU for 5 s (SHARDKIT_NCCL_TIMEOUT)"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 120.0);
  EXPECT_EQ(ckpt::read_latest(dir / "run").value_or(""), "step-00000002")
      << "the checkpoint before the stall is intact";
}

}  // namespace
}  // namespace shardkit
