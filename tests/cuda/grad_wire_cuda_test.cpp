// communication_data_type on GPU ranks: the NCCL reductions of every ZeRO stage, in fp32, bf16 and
// fp16, give the gradients the CPU ranks give (trainer/grad_wire.hpp, itself checked against the
// rounding formula by tests/mpi/grad_wire_mpi_test.cpp): both engines get the same gradients, and
// their gradient norms must agree to the last bits. Skipped (with a message) without a GPU per rank.
#include <gtest/gtest.h>

#include <vector>

#include "comm/mpi.hpp"
#include "model/cuda/kernels.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/zero_engine.hpp"

namespace shardkit {
namespace {

using ckpt::DType;

// Rank r's gradient of tensor t: values near 1 with 12 significant bits (bf16 keeps 8, fp16 11).
std::vector<float> gradient(int rank, int t, int64_t n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    g[static_cast<size_t>(i)] = 1.0f + static_cast<float>((i * 5 + t + rank * 11) % 89) / 4096.0f;
  return g;
}

// Gives `engine` this rank's gradients for two micro-batches (groups opened forward, closed backward,
// as the model does; stages 2-3 reduce each micro-batch, the second adding to the first), reduces them
// and returns the global squared norm. `fill(group, t, values)` writes tensor t's gradient.
template <typename Engine, typename Fill>
double reduced_sq(Engine& engine, const ckpt::TensorTable& table, const std::vector<model::TensorGroup>& groups,
                  int rank, Fill fill) {
  engine.zero_grads();
  for (int micro = 0; micro < 2; ++micro) {
    for (size_t g = 0; g < groups.size(); ++g) engine.open_grads(static_cast<int>(g));
    for (size_t g = groups.size(); g-- > 0;) {
      for (int t = groups[g].first; t < groups[g].last; ++t) {
        fill(static_cast<int>(g), t, gradient(rank + 3 * micro, t, table[static_cast<size_t>(t)].numel()));
      }
      engine.close_grads(static_cast<int>(g));
    }
  }
  engine.reduce_grads();
  return engine.global_grad_sq();
}

TEST(GradWireCuda, NcclReductionsInEveryCommunicationTypeGiveWhatCpuRanksGive) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());
  trainer::cuda::DeviceContext context(world);
  // Sizes that split unevenly over the ranks, and bucket sizes that make several reductions a step.
  const ckpt::TensorTable table(
      {{"a", {1037}, DType::kF32}, {"b", {50, 9}, DType::kF32}, {"c", {4096}, DType::kF32}, {"d", {3}, DType::kF32}});
  const std::vector<model::TensorGroup> groups = {{0, 2}, {2, 4}};
  const std::vector<bool> decays(table.size(), true);  // no optimizer step here
  for (const DType wire : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      trainer::ZeroConfig config;
      config.stage = stage;
      config.reduce_bucket_size = 1500;
      config.allgather_bucket_size = 1500;
      trainer::ZeroEngine cpu(table, groups, decays, config, trainer::optimizer(trainer::OptimizerKind::kAdamW), wire,
                              world);
      const double want = reduced_sq(cpu, table, groups, world.rank(), [&](int, int t, const std::vector<float>& g) {
        float* grad = cpu.grad(t);
        for (size_t i = 0; i < g.size(); ++i) grad[i] += g[i];
      });
      for (const bool overlap : {false, true}) {
        config.overlap_comm = overlap;
        trainer::cuda::GpuZeroEngine<float> gpu(table, groups, decays, config,
                                                trainer::optimizer(trainer::OptimizerKind::kAdamW), wire, world,
                                                context.nccl(), context.stream());
        const double got =
            reduced_sq(gpu, table, groups, world.rank(), [&](int group, int t, const std::vector<float>& g) {
              // Written as the model's kernels write: stored where the engine says the group's buffers
              // hold nothing of the step (never cleared), else added (stages 0-1 accumulate over
              // micro-batches in place).
              const size_t bytes = g.size() * sizeof(float);
              if (gpu.grads_fresh(group)) {
                CUDA_CHECK(cudaMemcpyAsync(gpu.grad(t), g.data(), bytes, cudaMemcpyHostToDevice, context.stream()));
                CUDA_CHECK(cudaStreamSynchronize(context.stream()));
                return;
              }
              const model::cuda::DeviceBuffer<float> values(g.size());
              CUDA_CHECK(cudaMemcpy(values.data(), g.data(), bytes, cudaMemcpyHostToDevice));
              model::cuda::add_inplace(gpu.grad(t), values.data(), static_cast<int64_t>(g.size()), context.stream());
              CUDA_CHECK(cudaStreamSynchronize(context.stream()));  // before `values` is freed
            });
        EXPECT_NEAR(got, want, want * 1e-12) << "stage " << stage << ", wire " << ckpt::dtype_name(wire)
                                             << ", overlap_comm " << overlap << ", " << world.size() << " ranks";
      }
    }
  }
}

}  // namespace
}  // namespace shardkit
