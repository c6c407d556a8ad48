// communication_data_type on CPU ranks (trainer/grad_wire.hpp): with bf16 or fp16 the reduced gradient
// is the 16-bit rounding of the sum of every rank's 16-bit rounded gradient, at every ZeRO stage; fp32,
// and any type on one rank (nothing travels), leave the exact sum. Checked through the engine's
// gradient norm, on values whose low bits the rounding drops. Run at 1-4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ckpt/dtype_convert.hpp"
#include "comm/mpi.hpp"
#include "trainer/zero_engine.hpp"

namespace shardkit {
namespace {

using ckpt::DType;

// Rank r's gradient of tensor t at element i: 1 + k / 4096 (k < 97), exact in fp32, 12 significant
// bits, of which bf16 keeps 8 and fp16 11.
float gradient(int rank, int t, int64_t i) {
  return 1.0f + static_cast<float>((i * 7 + t * 3 + rank * 5) % 97) / 4096.0f;
}

float round_to(float x, DType wire) {
  if (wire == DType::kBF16) return ckpt::bf16_to_fp32(ckpt::fp32_to_bf16(x));
  if (wire == DType::kF16) return ckpt::fp16_to_fp32(ckpt::fp32_to_fp16(x));
  return x;
}

// The squared norm the reduction should give (sums of at most four such values are exact in fp32).
double expected_sq(const ckpt::TensorTable& table, int world, DType wire) {
  const DType w = world > 1 ? wire : DType::kF32;
  double sq = 0.0;
  for (int t = 0; t < static_cast<int>(table.size()); ++t) {
    for (int64_t i = 0; i < table[static_cast<size_t>(t)].numel(); ++i) {
      float sum = 0.0f;
      for (int r = 0; r < world; ++r) sum += round_to(gradient(r, t, i), w);
      const double reduced = round_to(sum, w);
      sq += reduced * reduced;
    }
  }
  return sq;
}

TEST(GradWireMpi, ReducedGradientsAreRoundedToTheCommunicationTypeAtEveryStage) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  const ckpt::TensorTable table(
      {{"a", {37}, DType::kF32}, {"b", {5, 9}, DType::kF32}, {"c", {64}, DType::kF32}, {"d", {3}, DType::kF32}});
  const std::vector<model::TensorGroup> groups = {{0, 2}, {2, 4}};
  const std::vector<bool> decays(table.size(), true);  // no optimizer step here
  for (const DType wire : {DType::kF32, DType::kBF16, DType::kF16}) {
    const double want = expected_sq(table, world.size(), wire);
    for (int stage = 0; stage <= 3; ++stage) {
      trainer::ZeroConfig config;
      config.stage = stage;
      config.reduce_bucket_size = 50;  // several reductions per step
      trainer::ZeroEngine engine(table, groups, decays, config, trainer::optimizer(trainer::OptimizerKind::kAdamW),
                                 wire, world);
      engine.zero_grads();
      // Opened in the forward order and closed in the backward order, as the model does.
      for (int g = 0; g < 2; ++g) engine.open_grads(g);
      for (int g = 1; g >= 0; --g) {
        for (int t = groups[static_cast<size_t>(g)].first; t < groups[static_cast<size_t>(g)].last; ++t) {
          float* grad = engine.grad(t);
          for (int64_t i = 0; i < table[static_cast<size_t>(t)].numel(); ++i) grad[i] += gradient(world.rank(), t, i);
        }
        engine.close_grads(g);
      }
      engine.reduce_grads();
      EXPECT_NEAR(engine.global_grad_sq(), want, want * 1e-12)
          << "stage " << stage << ", wire " << ckpt::dtype_name(wire) << ", " << world.size() << " ranks";
    }
  }
  // The check can fail: with two ranks or more, every 16-bit type changes the norm.
  if (world.size() > 1) {
    EXPECT_NE(expected_sq(table, world.size(), DType::kBF16), expected_sq(table, world.size(), DType::kF32));
    EXPECT_NE(expected_sq(table, world.size(), DType::kF16), expected_sq(table, world.size(), DType::kF32));
  }
}

}  // namespace
}  // namespace shardkit
