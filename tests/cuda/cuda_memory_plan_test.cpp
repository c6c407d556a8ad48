// The memory plan said at start-up is what the rank then holds: for each stage, with the optimizer
// and the parameters offloaded, with activation checkpointing, for both families, the plan's parameters, gradients,
// optimizer states and activations are the memory line's (the same bytes, the same rounding, offloaded ones named as
// such); its total is the device memory the run then takes (measured after the first step, working
// buffers, cuBLAS's and NCCL's included) to 10 %. And a run that cannot fit is refused before it
// allocates, with the settings that would fit. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

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

// "53.90 GB" (format_bytes: powers of 1000) as bytes.
double parse_bytes(const std::string& text) {
  std::smatch m;
  if (!std::regex_match(text, m, std::regex(R"(([0-9.]+) ([kMGT]?)B)"))) {
    ADD_FAILURE() << "not a size: " << text;
    return 0;
  }
  const std::string units = "kMGT";
  const size_t power = m[2].length() == 0 ? 0 : units.find(m[2].str()) + 1;
  return std::stod(m[1]) * std::pow(1000.0, static_cast<double>(power));
}

TEST(CudaMemoryPlan, ThePlanMatchesTheMemoryMeasuredAfterTheFirstStep) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  // Random ids below every preset's vocabulary, enough for the batches below (raw uint16).
  const std::string data = (dir / "tokens.bin").string();
  {
    std::vector<uint16_t> ids(1 << 20);
    uint32_t x = 12345;
    for (uint16_t& id : ids) id = static_cast<uint16_t>((x = x * 1664525u + 1013904223u) >> 16) % 32000;
    std::ofstream(data, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
  }
  // Stage 2's gradient buckets (GPT-2), stage 3's gathered groups and reductions with accumulation
  // (Llama, untied head): shapes whose working buffers are gigabytes, not lost in cuBLAS's workspaces;
  // and activation checkpointing, with the block inputs on the GPU and in host memory.
  struct Case {
    const char* model;
    int stage, micro_batch, accumulation;
    const char* checkpointing = "";  // the activation_checkpointing section, if any
  };
  const Case cases[] = {{"gpt2-large", 2, 4, 1},
                        {"tinyllama-1.1b", 3, 4, 2},
                        {"tinyllama-1.1b", 1, 8, 1, R"({"cpu_checkpointing": false})"},
                        {"gpt2-large", 1, 8, 1, R"({"cpu_checkpointing": true})"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " stage " + std::to_string(c.stage) + " " + c.checkpointing);
    const std::string path = (dir / (std::string(c.model) + std::to_string(c.stage) + ".json")).string();
    std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": )" << c.micro_batch
                        << R"(, "gradient_accumulation_steps": )" << c.accumulation
                        << R"(, "bf16": {"enabled": true}, "zero_optimization": {"stage": )" << c.stage
                        << R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}})"
                        << (*c.checkpointing ? std::string(R"(, "activation_checkpointing": )") + c.checkpointing : "")
                        << "}";
    const Result r = run("train --config " + path + " --model " + c.model + " --device cuda --data " + data +
                             " --seq-len 1024 --steps 2",
                         "timeout -s KILL 300 " + mpirun(1));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string out = r.out + r.err;
    const std::string size = "([0-9.]+ [kMGT]?B)";
    const std::string planned = find(out, "memory plan per rank: .*; GPU " + size + " of ");
    EXPECT_EQ(find(out, "GPU memory after the first step: .* in use on rank 0, planned " + size), planned);
    const double measured = parse_bytes(find(out, "GPU memory after the first step: " + size + " in use"));
    EXPECT_NEAR(parse_bytes(planned) / measured, 1.0, 0.10) << "planned " << planned << ", measured " << measured;
    std::printf("%s at stage %d %s: planned %s, measured %.2f GB\n", c.model, c.stage, c.checkpointing, planned.c_str(),
                measured / 1e9);
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
