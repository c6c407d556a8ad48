// Weight decay by parameter group on GPU ranks, for each model family, ZeRO stage and offload: with
// zero gradients one AdamW step moves exactly the tensors the model says decay (by lr * weight_decay *
// w) and leaves the biases and normalisation weights to the bit -- in the rank's master states (the
// kernel's device table, or the host optimizer's, chunk by chunk) and in the parameters the model
// reads after the step. Skipped (with a message) without a GPU per rank.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "model/registry.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/support/weight_decay_check.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit {
namespace {

using trainer::OffloadDevice;

struct Case {
  int stage;
  OffloadDevice offload_optimizer;
  OffloadDevice offload_param;
};

TEST(WeightDecayCuda, WithZeroGradientsExactlyTheDecayingTensorsMove) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());
  trainer::cuda::DeviceContext context(world);
  constexpr OffloadDevice kNone = OffloadDevice::kNone, kCpu = OffloadDevice::kCpu;
  const Case cases[] = {{0, kNone, kNone}, {1, kNone, kNone}, {2, kNone, kNone}, {3, kNone, kNone}, {1, kCpu, kNone},
                        {2, kCpu, kNone},  {3, kCpu, kNone},  {3, kCpu, kCpu},   {3, kNone, kCpu}};
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const auto model = model::resolve_model(name);
    const std::vector<bool> decays = trainer::decay_flags(*model);
    for (const Case& s : cases) {
      trainer::ZeroConfig config;
      config.stage = s.stage;
      config.offload_optimizer.device = s.offload_optimizer;
      config.offload_param.device = s.offload_param;
      trainer::cuda::GpuZeroEngine<float> engine(model->table(), model->groups(), decays, config,
                                                 trainer::optimizer(trainer::OptimizerKind::kAdamW), ckpt::DType::kF32,
                                                 world, context.nccl(), context.stream());
      const float decay = testing::step_with_zero_gradients(engine);
      const std::string where = std::string(name) + " stage " + std::to_string(s.stage) + " offload_optimizer " +
                                trainer::offload_device_name(s.offload_optimizer) + " offload_param " +
                                trainer::offload_device_name(s.offload_param) + " rank " +
                                std::to_string(world.rank()) + "/" + std::to_string(world.size()) + ": ";
      // The master partition as a save snapshots it.
      const size_t flat = static_cast<size_t>(engine.layout().flat_size());
      model::cuda::PinnedBuffer<float> master(flat), exp_avg(flat), exp_avg_sq(flat);
      const std::span<float> targets[] = {{master.data(), flat}, {exp_avg.data(), flat}, {exp_avg_sq.data(), flat}};
      engine.begin_snapshot(targets);
      engine.wait_snapshot();
      testing::expect_stepped_master({master.data(), flat}, engine.layout(), world.rank(), *model, decay, where);
      testing::expect_stepped_parameters(engine, *model, decay, where, [&](int t) {
        engine.synchronize(context.stream());  // the group's gather
        std::vector<float> p(static_cast<size_t>(model->table()[static_cast<size_t>(t)].numel()));
        CUDA_CHECK(cudaMemcpy(p.data(), engine.param(t), p.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return p;
      });
      engine.synchronize(context.stream());
    }
  }
}

}  // namespace
}  // namespace shardkit
