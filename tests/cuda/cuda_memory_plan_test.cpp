// The memory plan said at start-up is what the rank then holds: for each stage, with the optimizer
// and the parameters offloaded, for both families, the plan's parameters, gradients, optimizer states
// and activations are the memory line's (the same bytes, the same rounding, offloaded ones named as
// such). And a run that cannot fit is refused before it allocates, with the settings that would fit.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

std::string config(const testing::TempDir& dir, int stage, const std::string& offload, int micro_batch) {
  static int files = 0;
  const std::string path = (dir / ("config" + std::to_string(++files) + ".json")).string();
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": )" << micro_batch
                      << R"(, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
    "zero_optimization": {"stage": )"
                      << stage << offload << R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  return path;
}

// The first capture of `pattern` in `text`, or "" (a failure).
std::string find(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) {
    ADD_FAILURE() << "no " << pattern << " in:\n" << text;
    return "";
  }
  return m[1];
}

TEST(CudaMemoryPlan, ThePlanIsWhatTheRankHolds) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string offload_optimizer = R"(, "offload_optimizer": {"device": "cpu"})";
  const std::string offload_both = offload_optimizer + R"(, "offload_param": {"device": "cpu"})";
  struct Case {
    const char* model;
    int stage;
    std::string offload;
  };
  const Case cases[] = {{"gpt2-tiny", 0, ""}, {"gpt2-tiny", 1, ""},           {"gpt2-tiny", 2, offload_optimizer},
                        {"gpt2-tiny", 3, ""}, {"gpt2-tiny", 3, offload_both}, {"llama-tiny", 1, ""},
                        {"llama-tiny", 3, ""}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " stage " + std::to_string(c.stage) + c.offload);
    const Result r = run("train --config " + config(dir, c.stage, c.offload, 3) + " --model " + c.model +
                             " --device cuda --data " + data + " --steps 1",
                         "timeout -s KILL 120 " + mpirun(1));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string out = r.out + r.err;
    const std::string held = "(parameters .*?, activations [0-9.]+ [kMGT]?B)";
    EXPECT_EQ(find(out, "memory plan per rank: " + held), find(out, "rank 0: " + held));
  }
}

TEST(CudaMemoryPlan, ARunThatCannotFitIsRefusedBeforeItAllocatesWithWhatWouldFit) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  // gpt2-xl at 512 x 1024 tokens a micro-batch: over a terabyte of activations. (One process without
  // mpirun, whose own report of a failed rank would add lines.)
  const Result r = run("train --config " + config(dir, 1, "", 512) + " --model gpt2-xl --device cuda --data " +
                           write_text_tokens(dir).string() + " --steps 1 --seq-len 1024",
                       "timeout -s KILL 60");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("model gpt2-xl at ZeRO stage 1, micro-batch 512 x 1024 on 1 GPU(s) needs "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("of GPU memory per rank (parameters "), std::string::npos) << r.err;
  // Only a smaller micro-batch can fit (no stage or offload shrinks activations): the largest one.
  EXPECT_NE(r.err.find("would fit: train_micro_batch_size_per_gpu "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("; or train_micro_batch_size_per_gpu"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("out of GPU memory"), std::string::npos) << "refused by an allocation: " << r.err;
}

}  // namespace
}  // namespace shardkit
