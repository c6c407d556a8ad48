// The CPU AdamW against a scalar double-precision transcription of DeepSpeed's update, both modes, with
// and without bias correction, lengths that are not multiples of the vector width or the thread
// blocks; the narrowed output equals rounding the updated fp32 weights; weight decay skips exactly the
// ranges of a no-decay table, wherever they cut the blocks, and the table of a view is what the
// fragments placed in it say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "ckpt/dtype_convert.hpp"
#include "ckpt/layout.hpp"
#include "model/registry.hpp"
#include "trainer/adamw.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {
namespace {

struct State {
  std::vector<float> w, m, v, g;
};

State random_state(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.w[i] = dist(rng);
    s.m[i] = 0.1f * dist(rng);
    s.v[i] = 0.01f * std::abs(dist(rng));
    s.g[i] = dist(rng);
  }
  return s;
}

// DeepSpeed's AdamW (and Adam with L2) in double; `decays(i)`: whether element i takes weight decay
// (a parameter group with weight_decay 0 where not).
template <typename Decays>
void reference(State& s, const OptimizerStep& a, Decays decays) {
  const double bc1 = a.bias_correction ? 1 - std::pow(a.beta1, double(a.step)) : 1;
  const double bc2 = a.bias_correction ? 1 - std::pow(a.beta2, double(a.step)) : 1;
  for (size_t i = 0; i < s.w.size(); ++i) {
    const double wd = decays(i) ? a.weight_decay : 0.0;
    double w = s.w[i], g = double{s.g[i]} * a.grad_multiplier;
    if (!a.adam_w_mode) g += wd * w;
    const double m = a.beta1 * double{s.m[i]} + (1 - a.beta1) * g;
    const double v = a.beta2 * double{s.v[i]} + (1 - a.beta2) * g * g;
    if (a.adam_w_mode) w -= a.lr * wd * w;
    w -= a.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + a.eps);
    s.w[i] = static_cast<float>(w);
    s.m[i] = static_cast<float>(m);
    s.v[i] = static_cast<float>(v);
  }
}

void reference(State& s, const OptimizerStep& a) {
  reference(s, a, [](size_t) { return true; });
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(double{want[i]}))) << what << " element " << i;
  }
}

TEST(CpuAdamW, MatchesTheReferenceInBothModes) {
  for (const bool adam_w_mode : {true, false}) {
    for (const bool bias_correction : {true, false}) {
      OptimizerStep a;
      a.lr = 1e-3;
      a.beta1 = 0.9;
      a.beta2 = 0.95;
      a.eps = 1e-8;
      a.weight_decay = 0.1;
      a.adam_w_mode = adam_w_mode;
      a.bias_correction = bias_correction;
      a.step = 7;
      a.grad_multiplier = 0.25;
      const size_t n = 3 * 16384 + 37;  // blocks, a partial block, a partial vector
      State got = random_state(n, 1), want = got;
      cpu_adamw(got.w, got.m, got.v, got.g, AdamWCoefficients::of(a));
      reference(want, a);
      expect_close(got.w, want.w, "weights");
      expect_close(got.m, want.m, "exp_avg");
      expect_close(got.v, want.v, "exp_avg_sq");
    }
  }
}

TEST(CpuAdamW, WeightDecaySkipsExactlyTheNoDecayRanges) {
  // Ranges inside a block, across a block boundary (kBlock = 16384), touching the arrays' ends, one
  // element long; the arrays are a chunk of a view starting at position 1000 (as the offloaded
  // optimizer updates it), so the table is in view positions.
  constexpr int64_t kOrigin = 1000;
  const std::vector<ElementRange> view = {{0, 1200},
                                          {1500, 1501},
                                          {kOrigin + 16000, kOrigin + 17000},
                                          {kOrigin + 20000, kOrigin + 20017},
                                          {kOrigin + 2 * 16384 - 5, kOrigin + 3 * 16384 + 37}};
  auto skipped = [&](size_t i) {
    const int64_t at = kOrigin + static_cast<int64_t>(i);
    return std::ranges::any_of(view, [&](const ElementRange& r) { return r.begin <= at && at < r.end; });
  };
  for (const bool adam_w_mode : {true, false}) {
    OptimizerStep a;
    a.lr = 1e-2;
    a.weight_decay = 0.5;
    a.adam_w_mode = adam_w_mode;
    a.step = 3;
    const size_t n = 3 * 16384 + 37;
    State got = random_state(n, 4), want = got;
    cpu_adamw(got.w, got.m, got.v, got.g, AdamWCoefficients::of(a),
              NoDecayRanges{view.data(), static_cast<int64_t>(view.size())}.at(kOrigin));
    reference(want, a, [&](size_t i) { return !skipped(i); });
    expect_close(got.w, want.w, "weights");
    expect_close(got.m, want.m, "exp_avg");
    expect_close(got.v, want.v, "exp_avg_sq");
  }
}

TEST(CpuAdamW, WithZeroGradientsOnlyDecayingElementsMove) {
  // Moments zero, gradients zero: the step is w - lr * wd * w where the tensor decays, and w, to the
  // bit, where it does not.
  OptimizerStep a;
  a.lr = 0.1;
  a.weight_decay = 0.5;
  const AdamWCoefficients c = AdamWCoefficients::of(a);
  const std::vector<ElementRange> skip = {{3, 40000}};
  const size_t n = 50000;
  State s = random_state(n, 5);
  std::ranges::fill(s.m, 0.0f);
  std::ranges::fill(s.v, 0.0f);
  std::ranges::fill(s.g, 0.0f);
  const std::vector<float> before = s.w;
  cpu_adamw(s.w, s.m, s.v, s.g, c, {skip.data(), 1});
  for (size_t i = 0; i < n; ++i) {
    if (i >= 3 && i < 40000) {
      ASSERT_EQ(s.w[i], before[i]) << "element " << i;
    } else {
      // (to 4 ulp: a compiler may fuse the multiply and subtract in one place and not the other)
      ASSERT_FLOAT_EQ(s.w[i], before[i] - c.decay * before[i]) << "element " << i;
    }
  }
}

TEST(CpuAdamW, AnElementsUpdateIsTheSameBitsWhereverTheViewStarts) {
  // World sizes and stages cut the optimizer's views at different offsets: an element's update must
  // not depend on its place in a vector or a block (a compiler fusing multiply-adds in the vector
  // loop and not in its scalar ends makes it depend on that).
  OptimizerStep a;
  a.lr = 1e-3;
  a.beta2 = 0.95;
  a.weight_decay = 0.1;
  a.step = 5;
  const AdamWCoefficients c = AdamWCoefficients::of(a);
  const size_t n = 2 * 16384 + 101;
  const State start = random_state(n, 8);
  State whole = start;
  cpu_adamw(whole.w, whole.m, whole.v, whole.g, c);
  for (const size_t offset : {size_t{1}, size_t{3}, size_t{7}, size_t{13}, size_t{16384 + 5}}) {
    State part = start;
    const auto from = [&](std::vector<float>& x) { return std::span(x).subspan(offset); };
    cpu_adamw(from(part.w), from(part.m), from(part.v), std::span<const float>(part.g).subspan(offset), c);
    for (size_t i = offset; i < n; ++i) {
      ASSERT_EQ(part.w[i], whole.w[i]) << "weight " << i << ", view from " << offset;
      ASSERT_EQ(part.m[i], whole.m[i]) << "exp_avg " << i << ", view from " << offset;
      ASSERT_EQ(part.v[i], whole.v[i]) << "exp_avg_sq " << i << ", view from " << offset;
    }
  }
}

TEST(WeightDecay, TheTableOfAViewIsItsNoDecayFragmentsMerged) {
  // Tensors 0 and 3 decay. Fragments out of order, padding between 1 and 2 (merged: padding never
  // moves), a decaying fragment between 2 and 4 (kept apart).
  const std::vector<bool> decays = {true, false, false, true, false};
  const std::vector<ckpt::Fragment> plan = {
      {4, 0, 5, 100}, {0, 10, 20, 0}, {2, 0, 8, 48}, {1, 3, 12, 20}, {3, 0, 30, 60}};
  const std::vector<ElementRange> got = no_decay_ranges(plan, decays);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].begin, 20);
  EXPECT_EQ(got[0].end, 56);
  EXPECT_EQ(got[1].begin, 100);
  EXPECT_EQ(got[1].end, 105);
  EXPECT_TRUE(no_decay_ranges({}, decays).empty());
  EXPECT_THROW(no_decay_ranges(plan, {true, true}), Error);
}

TEST(WeightDecay, EveryStagesTableCoversExactlyTheUndecayedTensorsElements) {
  // For each family, world size and stage: every element of every tensor is found in its owner's
  // table exactly when the tensor does not decay, the partitions cutting through tensors.
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const auto model = model::resolve_model(name);
    const std::vector<bool> decays = decay_flags(*model);
    for (const int world : {1, 2, 3, 7}) {
      for (int stage = 0; stage <= 3; ++stage) {
        const ckpt::Layout layout(model->table(), {world, stage, ckpt::kDefaultAlignment});
        for (int rank = 0; rank < world; ++rank) {
          const std::vector<ckpt::Fragment> plan = layout.fragments(rank);
          const std::vector<ElementRange> table = no_decay_ranges(plan, decays);
          for (size_t k = 1; k < table.size(); ++k) ASSERT_LT(table[k - 1].end, table[k].begin);
          for (const ckpt::Fragment& f : plan) {
            for (const int64_t at : {f.flat_offset, f.flat_offset + f.length / 2, f.flat_offset + f.length - 1}) {
              const bool skipped =
                  std::ranges::any_of(table, [&](const ElementRange& r) { return r.begin <= at && at < r.end; });
              ASSERT_EQ(skipped, !decays[static_cast<size_t>(f.tensor)])
                  << name << " world " << world << " stage " << stage << " rank " << rank << " tensor "
                  << model->table()[static_cast<size_t>(f.tensor)].name;
            }
          }
        }
      }
    }
  }
}

TEST(CpuAdamW, NarrowedWeightsAreTheRoundedUpdate) {
  OptimizerStep a;
  a.lr = 1e-2;
  a.weight_decay = 0.01;
  const size_t n = 20000;
  for (const ckpt::DType narrow : {ckpt::DType::kBF16, ckpt::DType::kF16}) {
    State s = random_state(n, 2);
    std::vector<uint16_t> narrowed(n);
    cpu_adamw(s.w, s.m, s.v, s.g, AdamWCoefficients::of(a), {}, narrow, narrowed.data());
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = narrow == ckpt::DType::kBF16 ? ckpt::fp32_to_bf16(s.w[i]) : ckpt::fp32_to_fp16(s.w[i]);
      ASSERT_EQ(narrowed[i], want) << "element " << i;
    }
  }
}

TEST(CpuAdamW, NarrowWeightsRoundsEveryElement) {
  const State s = random_state(70001, 3);
  std::vector<uint16_t> bf16(s.w.size()), fp16(s.w.size());
  narrow_weights(s.w, ckpt::DType::kBF16, bf16.data());
  narrow_weights(s.w, ckpt::DType::kF16, fp16.data());
  for (size_t i = 0; i < s.w.size(); ++i) {
    ASSERT_EQ(bf16[i], ckpt::fp32_to_bf16(s.w[i])) << i;
    ASSERT_EQ(fp16[i], ckpt::fp32_to_fp16(s.w[i])) << i;
  }
}

TEST(CpuAdamW, EmptyArraysAreANoOp) {
  std::vector<float> none;
  cpu_adamw(none, none, none, none, AdamWCoefficients::of(OptimizerStep{}));
}

}  // namespace
}  // namespace shardkit::trainer
