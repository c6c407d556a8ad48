// `shardkit eval --device cuda` scores a checkpoint as the CPU does: in fp32 to within 1e-5 of the
// CPU's loss, in bf16 and fp16 within 2 %, for both families, over a number of windows that leaves a
// last, shorter batch (8 + 2). On two ranks, a GPU each, it gives one GPU's bits; two ranks on one GPU
// are refused as training refuses them. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

class CudaEval : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaEval, TheGpuScoresACheckpointAsTheCpuDoes) {
  REQUIRE_GPUS(1);
  const std::string model = GetParam();
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string run_dir = (dir / "run").string();
  Result r = run("train --config " + samples() + "tiny_zero2.json --model " + model + " --data " + data +
                 " --steps 8 --save-dir " + run_dir + " --threads 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto loss = [&](const std::string& device) {
    const Result e =
        run("eval " + run_dir + " --data " + data + " --windows 10 --json " + device, "timeout -s KILL 120");
    EXPECT_EQ(e.code, 0) << device << ": " << e.err;
    const auto j = nlohmann::json::parse(e.code == 0 ? e.out : "{\"loss\": 0, \"tokens\": 0}");
    EXPECT_EQ(j["tokens"], 10 * 64) << device;
    return j["loss"].get<double>();
  };
  const double cpu = loss("--device cpu");
  ASSERT_GT(cpu, 0.5);
  const double cuda = loss("--device cuda");
  EXPECT_NEAR(cuda, cpu, 1e-5 * cpu);
  // The default, auto, takes the GPU: the same bits as --device cuda.
  EXPECT_EQ(loss(""), cuda);
  const Result automatic = run("eval " + run_dir + " --data " + data + " --windows 10", "timeout -s KILL 120");
  EXPECT_NE(automatic.out.find(" on cuda (auto: "), std::string::npos) << automatic.out << automatic.err;
  EXPECT_NEAR(loss("--device cuda --dtype bf16"), cpu, 2e-2 * cpu);
  EXPECT_NEAR(loss("--device cuda --dtype fp16"), cpu, 2e-2 * cpu);
}

TEST(CudaEvalRanks, TwoRanksSplitTheWindowsAndGiveOneGpusBits) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string run_dir = (dir / "run").string();
  Result r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
                 " --steps 2 --save-dir " + run_dir + " --threads 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string eval = "eval " + run_dir + " --data " + data + " --windows 20 --json --device cuda";
  const Result two = run(eval, "timeout -s KILL 120 " + mpirun(2));
  if (testing::visible_gpus() < 2) {
    EXPECT_NE(two.code, 0);
    EXPECT_NE(two.err.find("both took GPU"), std::string::npos) << two.err;
    return;
  }
  const Result one = run(eval, "timeout -s KILL 120");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(two.out), nlohmann::json::parse(one.out));
}

INSTANTIATE_TEST_SUITE_P(Families, CudaEval, ::testing::Values("gpt2-tiny", "llama-tiny"), [](const auto& param_info) {
  std::string name = param_info.param;
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
});

}  // namespace
}  // namespace shardkit
