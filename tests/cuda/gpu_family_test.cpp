// The CUDA half of the family registry: every preset belongs to exactly one registered GPU family, the
// one of its own family (no device needed), whose factory answers for it.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/gpt2/cuda/gpu_model.hpp"
#include "model/gpt2/model.hpp"
#include "model/llama/cuda/gpu_model.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit::model::cuda {
namespace {

// The registered GPU family of a family's name, as its own cuda/ folder made it.
const GpuFamily* expected_gpu_family(const std::string& family) {
  if (family == "gpt2") return &gpt2::gpu_family();
  if (family == "llama") return &llama::gpu_family();
  return nullptr;
}

TEST(GpuFamilies, EveryPresetIsOwnedByItsOwnFamilysKernelsAlone) {
  EXPECT_EQ(gpu_families().size(), families().size()) << "a family without CUDA kernels: update this test";
  for (const Family* family : families()) {
    const GpuFamily* expected = expected_gpu_family(family->name);
    ASSERT_NE(expected, nullptr) << family->name;
    for (const std::string& preset : family->presets) {
      const auto model = family->preset(preset);
      int owners = 0;
      for (const GpuFamily* gpu : gpu_families()) owners += gpu->owns(*model) ? 1 : 0;
      EXPECT_EQ(owners, 1) << preset;
      EXPECT_TRUE(expected->owns(*model)) << preset;
      EXPECT_EQ(&require_gpu_kernels(*model), expected) << preset;
    }
  }
}

TEST(GpuFamilies, TheFactoryPlansWhatTheFamilysModelPlans) {
  REQUIRE_GPUS(1);  // the plan asks the CUDA runtime for the embeddings' sort scratch
  const ActivationPlan plan{.batch = 2, .seq_len = 64};
  const auto gpt = resolve_model("gpt2-tiny");
  const ActivationBytes a = planned_activation_bytes<__nv_bfloat16>(*gpt, plan);
  const ActivationBytes b = gpt2::GpuGpt2<__nv_bfloat16>::planned_activation_bytes(*gpt2::config_of(*gpt), plan);
  EXPECT_GT(a.device, 0);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.host, b.host);
  const auto llama = resolve_model("llama-tiny");
  const ActivationBytes c = planned_activation_bytes<float>(*llama, plan);
  const ActivationBytes d = llama::GpuLlama<float>::planned_activation_bytes(*llama::config_of(*llama), plan);
  EXPECT_GT(c.device, 0);
  EXPECT_EQ(c.device, d.device);
  // Another compute type, other bytes: the factory of the type asked for answered.
  EXPECT_NE(planned_activation_bytes<__nv_bfloat16>(*llama, plan).device, c.device);
}

}  // namespace
}  // namespace shardkit::model::cuda
