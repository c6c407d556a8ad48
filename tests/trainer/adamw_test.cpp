// The CPU AdamW against a scalar double-precision transcription of DeepSpeed's update, both modes, with
// and without bias correction, lengths that are not multiples of the vector width or the thread
// blocks; the narrowed output equals rounding the updated fp32 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ckpt/dtype_convert.hpp"
#include "trainer/adamw.hpp"

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

// DeepSpeed's AdamW (and Adam with L2) in double.
void reference(State& s, const AdamWStep& a) {
  const double bc1 = a.bias_correction ? 1 - std::pow(a.beta1, double(a.step)) : 1;
  const double bc2 = a.bias_correction ? 1 - std::pow(a.beta2, double(a.step)) : 1;
  for (size_t i = 0; i < s.w.size(); ++i) {
    double w = s.w[i], g = double{s.g[i]} * a.grad_multiplier;
    if (!a.adam_w_mode) g += a.weight_decay * w;
    const double m = a.beta1 * double{s.m[i]} + (1 - a.beta1) * g;
    const double v = a.beta2 * double{s.v[i]} + (1 - a.beta2) * g * g;
    if (a.adam_w_mode) w -= a.lr * a.weight_decay * w;
    w -= a.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + a.eps);
    s.w[i] = static_cast<float>(w);
    s.m[i] = static_cast<float>(m);
    s.v[i] = static_cast<float>(v);
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(double{want[i]}))) << what << " element " << i;
  }
}

TEST(CpuAdamW, MatchesTheReferenceInBothModes) {
  for (const bool adam_w_mode : {true, false}) {
    for (const bool bias_correction : {true, false}) {
      AdamWStep a;
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

TEST(CpuAdamW, NarrowedWeightsAreTheRoundedUpdate) {
  AdamWStep a;
  a.lr = 1e-2;
  a.weight_decay = 0.01;
  const size_t n = 20000;
  for (const Narrow narrow : {Narrow::kBf16, Narrow::kFp16}) {
    State s = random_state(n, 2);
    std::vector<uint16_t> narrowed(n);
    cpu_adamw(s.w, s.m, s.v, s.g, AdamWCoefficients::of(a), narrow, narrowed.data());
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = narrow == Narrow::kBf16 ? ckpt::fp32_to_bf16(s.w[i]) : ckpt::fp32_to_fp16(s.w[i]);
      ASSERT_EQ(narrowed[i], want) << "element " << i;
    }
  }
}

TEST(CpuAdamW, NarrowWeightsRoundsEveryElement) {
  const State s = random_state(70001, 3);
  std::vector<uint16_t> bf16(s.w.size()), fp16(s.w.size());
  narrow_weights(s.w, Narrow::kBf16, bf16.data());
  narrow_weights(s.w, Narrow::kFp16, fp16.data());
  for (size_t i = 0; i < s.w.size(); ++i) {
    ASSERT_EQ(bf16[i], ckpt::fp32_to_bf16(s.w[i])) << i;
    ASSERT_EQ(fp16[i], ckpt::fp32_to_fp16(s.w[i])) << i;
  }
}

TEST(CpuAdamW, EmptyArraysAreANoOp) {
  std::vector<float> none;
  cpu_adamw(none, none, none, none, AdamWCoefficients::of(AdamWStep{}));
}

}  // namespace
}  // namespace shardkit::trainer
