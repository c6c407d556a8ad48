// The memory plan with activation checkpointing, against given limits rather than a device's (the plan
// is arithmetic, but the radix sort's scratch size is asked of CUB, which needs a device): its
// activations are fewer, those cpu_checkpointing keeps in host memory move there, and a run refused
// for want of GPU memory is offered --activation-checkpointing where that would fit -- the issue's
// case, llama-2-7b's shape at stage 1 with 8,192 tokens a sample on one H200.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <string>

#include "model/llama/config.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "trainer/cuda/memory_plan.hpp"

namespace shardkit {
namespace {

using trainer::cuda::MemoryLimits;
using trainer::cuda::MemoryPlan;
using trainer::cuda::RunShape;
using Bf16 = __nv_bfloat16;

trainer::ZeroConfig stage(int s) {
  trainer::ZeroConfig z;
  z.stage = s;
  return z;
}

RunShape shape(int batch, int seq_len, bool checkpointing, bool on_host = false) {
  RunShape r;
  r.activations = {.batch = batch, .seq_len = seq_len, .checkpointing = checkpointing, .inputs_on_host = on_host};
  return r;
}

// An H200 with the issue's 141 GB free, and a host with room to spare.
const MemoryLimits kH200{141'000'000'000, 1e12, 1, "CUDA device 0 (NVIDIA H200)"};

// llama-2-7b's shape with positions for 32 k tokens (the preset stops at Llama 2's 4,096).
std::shared_ptr<const model::Model> long_llama() {
  model::llama::LlamaConfig c = *model::llama::config_of(*model::resolve_model("llama-2-7b"));
  c.name = "llama-2-7b-32k";
  c.max_position_embeddings = 32768;
  return model::llama::make_model(c);
}

TEST(MemoryPlanCheckpointing, ActivationsShrinkAndCpuCheckpointingMovesTheInputsToTheHost) {
  REQUIRE_GPUS(1);
  const auto m = long_llama();
  const MemoryPlan kept = trainer::cuda::plan_memory<Bf16>(*m, stage(1), shape(1, 8192, false), 1, 0);
  const MemoryPlan recomputed = trainer::cuda::plan_memory<Bf16>(*m, stage(1), shape(1, 8192, true), 1, 0);
  const MemoryPlan on_host = trainer::cuda::plan_memory<Bf16>(*m, stage(1), shape(1, 8192, true, true), 1, 0);
  EXPECT_LT(recomputed.activations * 4, kept.activations) << recomputed.activations << " vs " << kept.activations;
  EXPECT_EQ(kept.activations_host, 0);
  EXPECT_EQ(recomputed.activations_host, 0);
  // 31 block outputs of 8,192 x 4,096 bf16 values go to the host; two slots of them stay on the GPU.
  const int64_t output = int64_t{8192} * 4096 * 2;
  EXPECT_EQ(on_host.activations_host, 31 * output);
  EXPECT_EQ(recomputed.activations - on_host.activations, 30 * output);
  EXPECT_EQ(on_host.host(), recomputed.host() + 31 * output);
  // Everything else is the same plan.
  EXPECT_EQ(recomputed.engine.working, kept.engine.working);
  EXPECT_EQ(recomputed.device() - recomputed.activations, kept.device() - kept.activations);
}

TEST(MemoryPlanCheckpointing, TheRefusalOffersActivationCheckpointingWhereItFits) {
  REQUIRE_GPUS(1);
  const auto m = long_llama();
  // At 2,048 tokens the model fits as it is; at 8,192 only with checkpointing (or offload).
  EXPECT_EQ(trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(1, 2048, false), 1, 0, kH200), "");
  const std::string refused = trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(1, 8192, false), 1, 0, kH200);
  EXPECT_NE(refused.find("model llama-2-7b-32k at ZeRO stage 1, micro-batch 1 x 8192 on 1 GPU(s) needs "),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("free on CUDA device 0 (NVIDIA H200); would fit: --activation-checkpointing (GPU "),
            std::string::npos)
      << refused;
  // Checkpointing alone fits: its host-memory variant is not offered beside it.
  EXPECT_EQ(refused.find("cpu_checkpointing"), std::string::npos) << refused;
  EXPECT_EQ(trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(1, 8192, true), 1, 0, kH200), "");

  // Micro-batch 4 at 2,048 tokens: the largest smaller micro-batch first, checkpointing next.
  const std::string batch = trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(4, 2048, false), 1, 0, kH200);
  EXPECT_NE(batch.find("would fit: train_micro_batch_size_per_gpu "), std::string::npos) << batch;
  EXPECT_NE(batch.find("; or --activation-checkpointing (GPU "), std::string::npos) << batch;

  // 32 k tokens with checkpointing on, 136 GB free: the block inputs (8.6 GB) must leave the GPU.
  const MemoryLimits tight{136'000'000'000, 1e12, 1, kH200.device};
  const std::string host = trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(1, 32768, true), 1, 0, tight);
  EXPECT_NE(host.find("micro-batch 1 x 32768 with activation checkpointing on 1 GPU(s) needs "), std::string::npos)
      << host;
  EXPECT_NE(host.find(R"(would fit: the config's "activation_checkpointing": {"cpu_checkpointing": true} (GPU )"),
            std::string::npos)
      << host;
  EXPECT_EQ(host.find("--activation-checkpointing"), std::string::npos) << host;
  // Not enough host memory for those inputs: the host's limit is named.
  const MemoryLimits small_host{kH200.device_free, 1e9, 1, kH200.device};
  const std::string short_host =
      trainer::cuda::memory_refusal<Bf16>(*m, stage(1), shape(1, 8192, true, true), 1, 0, small_host);
  EXPECT_NE(short_host.find(" of host memory per rank (1 rank(s) on this node), more than the 1.00 GB available"),
            std::string::npos)
      << short_host;
}

}  // namespace
}  // namespace shardkit
