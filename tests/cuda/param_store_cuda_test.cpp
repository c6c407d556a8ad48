// What the GPU engine says of its tensors' placement (GpuParamStore::params_back_to_back and
// grads_back_to_back), which decides whether Llama's q|k|v and gate|up run as one product: at stages
// 0-2 every parameter lies in one flat buffer, and at stages 0-1 every gradient, so a layer's tensors
// are one matrix; stage 3 gathers each parameter on its own and stage 2 opens each gradient on its
// own, and then the engine must say no whatever the allocator did. Where it says yes, the pointers it
// hands out are back to back. Skipped (with a message) without a GPU per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi.hpp"
#include "model/llama/config.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit {
namespace {

TEST(GpuParamStoreCuda, TensorsAreBackToBackExactlyWhereTheStageKeepsThemSo) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());
  trainer::cuda::DeviceContext context(world);
  const auto model = model::resolve_model("llama-tiny");
  const model::llama::LlamaConfig& c = *model::llama::config_of(*model);
  const ckpt::TensorTable& table = model->table();
  auto numel = [&](int t) { return table[static_cast<size_t>(t)].numel(); };
  for (int stage = 0; stage <= 3; ++stage) {
    trainer::ZeroConfig config;
    config.stage = stage;
    trainer::cuda::GpuZeroEngine<float> engine(table, model->groups(), trainer::decay_flags(*model), config,
                                               trainer::optimizer(trainer::OptimizerKind::kAdamW), ckpt::DType::kF32,
                                               world, context.nccl(), context.stream());
    engine.initialize([](int, int64_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.5f); });
    const std::string where = "stage " + std::to_string(stage) + " rank " + std::to_string(world.rank()) + ": ";
    for (int l = 0; l < c.n_layer; ++l) {
      const int first = model::llama::layer_tensor(l, 0);
      for (const auto& [from, to] :
           {std::pair{model::llama::kQ, model::llama::kV}, std::pair{model::llama::kGate, model::llama::kUp}}) {
        const int lo = first + from, hi = first + to + 1;
        const std::string what =
            where + "layer " + std::to_string(l) + " tensors " + std::to_string(lo) + "-" + std::to_string(hi - 1);
        EXPECT_EQ(engine.params_back_to_back(lo, hi), stage < 3) << what;
        EXPECT_EQ(engine.grads_back_to_back(lo, hi), stage < 2) << what;
        if (stage < 3) {
          for (int t = lo; t + 1 < hi; ++t) EXPECT_EQ(engine.param(t + 1), engine.param(t) + numel(t)) << what;
        }
        if (stage < 2) {
          for (int t = lo; t + 1 < hi; ++t) EXPECT_EQ(engine.grad(t + 1), engine.grad(t) + numel(t)) << what;
        }
      }
    }
    engine.synchronize(context.stream());
  }
}

}  // namespace
}  // namespace shardkit
