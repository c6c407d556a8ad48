// Weight decay by parameter group on CPU ranks, for each model family and ZeRO stage: with zero
// gradients one AdamW step moves exactly the tensors the model says decay (by lr * weight_decay * w)
// and leaves the biases and normalisation weights to the bit -- in each rank's master partition,
// whose ends cut through tensors at 2-4 ranks, and in the parameters every rank sees after the step.
// Run at 1-4 ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "model/registry.hpp"
#include "tests/support/weight_decay_check.hpp"
#include "trainer/weight_decay.hpp"
#include "trainer/zero_engine.hpp"

namespace shardkit {
namespace {

TEST(WeightDecayMpi, WithZeroGradientsExactlyTheDecayingTensorsMove) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const auto model = model::resolve_model(name);
    const std::vector<bool> decays = trainer::decay_flags(*model);
    for (int stage = 0; stage <= 3; ++stage) {
      trainer::ZeroConfig config;
      config.stage = stage;
      trainer::ZeroEngine engine(model->table(), model->groups(), decays, config,
                                 trainer::optimizer(trainer::OptimizerKind::kAdamW), ckpt::DType::kF32, world);
      const float decay = testing::step_with_zero_gradients(engine);
      const std::string where = std::string(name) + " stage " + std::to_string(stage) + " rank " +
                                std::to_string(world.rank()) + "/" + std::to_string(world.size()) + ": ";
      std::vector<float> master;
      engine.read_state(0,
                        [&](std::span<const float> chunk) { master.insert(master.end(), chunk.begin(), chunk.end()); });
      testing::expect_stepped_master(master, engine.layout(), world.rank(), *model, decay, where);
      testing::expect_stepped_parameters(engine, *model, decay, where, [&](int t) {
        const float* p = engine.param(t);
        return std::vector<float>(p, p + model->table()[static_cast<size_t>(t)].numel());
      });
    }
  }
}

}  // namespace
}  // namespace shardkit
