// The CPU Lion against a scalar double-precision transcription of the paper's update; an element whose
// update direction is exactly zero stays put; weight decay skips exactly the ranges of a no-decay table;
// the narrowed output equals rounding the updated weights; the descriptors list the states a
// checkpoint holds and update through the same functions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ckpt/dtype_convert.hpp"
#include "ckpt/shard_format.hpp"
#include "trainer/adamw.hpp"
#include "trainer/lion.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer {
namespace {

struct State {
  std::vector<float> w, m, g;
};

State random_state(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.w[i] = dist(rng);
    s.m[i] = 0.1f * dist(rng);
    s.g[i] = dist(rng);
  }
  return s;
}

OptimizerStep lion_step() {
  OptimizerStep a;
  a.kind = OptimizerKind::kLion;
  a.lr = 3e-4;
  a.beta1 = 0.9;
  a.beta2 = 0.99;
  a.weight_decay = 0.1;
  a.grad_multiplier = 0.5;
  return a;
}

// Lion in double; `decays(i)`: whether element i takes weight decay.
template <typename Decays>
void reference(State& s, const OptimizerStep& a, Decays decays) {
  for (size_t i = 0; i < s.w.size(); ++i) {
    const double g = double{s.g[i]} * a.grad_multiplier;
    const double c = a.beta1 * double{s.m[i]} + (1 - a.beta1) * g;
    const double sign = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
    const double keep = 1 - a.lr * (decays(i) ? a.weight_decay : 0.0);
    s.w[i] = static_cast<float>(double{s.w[i]} * keep - a.lr * sign);
    s.m[i] = static_cast<float>(a.beta2 * double{s.m[i]} + (1 - a.beta2) * g);
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(double{want[i]}))) << what << " element " << i;
  }
}

TEST(CpuLion, MatchesTheReferenceOverLengthsThatCutTheBlocks) {
  for (const size_t n : {size_t{1}, size_t{17}, size_t{16384}, size_t{40000}}) {
    State got = random_state(n, static_cast<uint32_t>(n)), want = got;
    const OptimizerStep a = lion_step();
    for (int step = 0; step < 3; ++step) {
      cpu_lion(got.w, got.m, got.g, LionCoefficients::of(a));
      reference(want, a, [](size_t) { return true; });
    }
    expect_close(got.w, want.w, "w");
    expect_close(got.m, want.m, "m");
  }
}

TEST(CpuLion, AnElementWithNoGradientAndNoMomentStaysWhereItIs) {
  // Padding between a rank's fragments, or a token never seen: sign(0) is 0 (the paper's and
  // PyTorch's), so neither the step nor (with decay) anything but the decay moves it.
  std::vector<float> w = {0.0f, 2.0f}, m = {0.0f, 0.0f}, g = {0.0f, 0.0f};
  OptimizerStep a = lion_step();
  a.weight_decay = 0;
  cpu_lion(w, m, g, LionCoefficients::of(a));
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], 2.0f);
  EXPECT_EQ(m[0], 0.0f);
}

TEST(CpuLion, WeightDecaySkipsExactlyTheNoDecayRanges) {
  const size_t n = 40000;
  State got = random_state(n, 5), want = got;
  const std::vector<ElementRange> skip = {{100, 16500}, {30000, 30001}};  // across a block boundary, one element
  const auto decays = [&](size_t i) {
    for (const ElementRange& r : skip) {
      if (static_cast<int64_t>(i) >= r.begin && static_cast<int64_t>(i) < r.end) return false;
    }
    return true;
  };
  const OptimizerStep a = lion_step();
  cpu_lion(got.w, got.m, got.g, LionCoefficients::of(a), {skip.data(), static_cast<int64_t>(skip.size())});
  reference(want, a, decays);
  expect_close(got.w, want.w, "w");
  // The same table shifted: a chunk of the view that starts at 20000.
  State chunk = random_state(n, 6), whole = chunk;
  const NoDecayRanges table{skip.data(), static_cast<int64_t>(skip.size())};
  cpu_lion(std::span(chunk.w).subspan(20000), std::span(chunk.m).subspan(20000),
           std::span<const float>(chunk.g).subspan(20000), LionCoefficients::of(a), table.at(20000));
  cpu_lion(whole.w, whole.m, whole.g, LionCoefficients::of(a), table);
  for (size_t i = 20000; i < n; ++i) ASSERT_EQ(chunk.w[i], whole.w[i]) << i;
}

TEST(CpuLion, TheNarrowedWeightsAreTheUpdatedWeightsRounded) {
  State s = random_state(20000, 9);
  std::vector<uint16_t> narrowed(s.w.size()), expected(s.w.size());
  cpu_lion(s.w, s.m, s.g, LionCoefficients::of(lion_step()), {}, ckpt::DType::kBF16, narrowed.data());
  ckpt::convert_fp32_to_bf16(s.w, expected);
  EXPECT_EQ(narrowed, expected);
}

TEST(Optimizers, EachDescriptorListsItsStatesAndUpdatesThroughItsOwnFunction) {
  ASSERT_EQ(optimizers().size(), 2u);
  const Optimizer& adamw = optimizer(OptimizerKind::kAdamW);
  const Optimizer& lion = optimizer(OptimizerKind::kLion);
  EXPECT_EQ(adamw.state_names(), ckpt::adamw_state_names());
  EXPECT_EQ(lion.state_names(), (std::vector<std::string>{"fp32", "exp_avg"}));
  EXPECT_EQ(adamw.state_bytes(), 12);
  EXPECT_EQ(lion.state_bytes(), 8);
  for (const Optimizer* o : optimizers()) EXPECT_EQ(o->states.front(), ckpt::kMasterWeights) << o->name;

  // Through the descriptor: the same bits as the functions themselves.
  State direct = random_state(1000, 3), through = direct;
  const OptimizerStep a = lion_step();
  cpu_lion(direct.w, direct.m, direct.g, LionCoefficients::of(a));
  const std::span<float> states[] = {through.w, through.m};
  lion.cpu_update(a, {states, through.g, {}});
  EXPECT_EQ(direct.w, through.w);
  EXPECT_EQ(direct.m, through.m);
}

}  // namespace
}  // namespace shardkit::trainer
