#include "trainer/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kTolerance = 1e-12;  // learning rates here are ~0.1; exact up to rounding

// The shared test setup: warmup over N = 10 steps, T = 50 total steps, and an optimizer lr (0.2) that
// differs from warmup_max_lr (0.1) so that using the wrong maximum shows.
constexpr int64_t kN = 10;
constexpr int64_t kT = 50;
constexpr double kBaseLr = 0.2;

SchedulerConfig make_config(SchedulerType type, const std::string& warmup_type) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_type = warmup_type;
  c.warmup_min_lr = 0.01;
  c.warmup_max_lr = 0.1;
  c.warmup_num_steps = kN;
  c.total_num_steps = kT;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.05;
  return c;
}

// DeepSpeed's formulas, written out directly for the setup above (min 0.01, max 0.1).
double expected_warmup_fraction(const std::string& warmup_type, int64_t k) {
  if (warmup_type == "log") return std::log(double(k) + 1) / std::log(double(kN));
  return double(k) / double(kN);
}

double expected_warmup_lr(const std::string& warmup_type, int64_t k) {
  if (k < 0) return 0.01;
  const double g = k < kN ? expected_warmup_fraction(warmup_type, k) : 1.0;
  return 0.01 + 0.09 * g;
}

double expected_warmup_decay_lr(const std::string& warmup_type, int64_t k) {
  if (k < kN) return expected_warmup_lr(warmup_type, k);
  const double g = double(kT - k) / double(kT - kN);
  return 0.01 + 0.09 * (g > 0 ? g : 0);
}

double expected_warmup_cosine_lr(const std::string& warmup_type, int64_t k) {
  if (k < 0) return 0;
  if (k < kN) return kBaseLr * (0.1 + 0.9 * expected_warmup_fraction(warmup_type, k));
  double p = double(k - kN + 1) / double(kT - kN);
  if (p > 1) p = 1;
  return kBaseLr * (0.05 + 0.95 * 0.5 * (1 + std::cos(kPi * p)));
}

// k = -1, 0, 1, N-1, N, N+1, T, T+5: before the first step, warmup start, warmup end, decay, the end.
const std::vector<int64_t> kCheckpoints = {-1, 0, 1, kN - 1, kN, kN + 1, kT, kT + 5};

class LrScheduleFormulas : public ::testing::TestWithParam<std::string> {};

TEST_P(LrScheduleFormulas, WarmupLrMatchesFormula) {
  const LrSchedule s(make_config(SchedulerType::kWarmupLR, GetParam()), kBaseLr);
  for (int64_t k : kCheckpoints) EXPECT_NEAR(s.lr(k), expected_warmup_lr(GetParam(), k), kTolerance) << "k=" << k;
}

TEST_P(LrScheduleFormulas, WarmupDecayLrMatchesFormula) {
  const LrSchedule s(make_config(SchedulerType::kWarmupDecayLR, GetParam()), kBaseLr);
  for (int64_t k : kCheckpoints) {
    EXPECT_NEAR(s.lr(k), expected_warmup_decay_lr(GetParam(), k), kTolerance) << "k=" << k;
  }
}

TEST_P(LrScheduleFormulas, WarmupCosineLrMatchesFormula) {
  const LrSchedule s(make_config(SchedulerType::kWarmupCosineLR, GetParam()), kBaseLr);
  for (int64_t k : kCheckpoints) {
    EXPECT_NEAR(s.lr(k), expected_warmup_cosine_lr(GetParam(), k), kTolerance) << "k=" << k;
  }
}

TEST_P(LrScheduleFormulas, EveryStepMatchesFormula) {
  const LrSchedule warmup(make_config(SchedulerType::kWarmupLR, GetParam()), kBaseLr);
  const LrSchedule decay(make_config(SchedulerType::kWarmupDecayLR, GetParam()), kBaseLr);
  const LrSchedule cosine(make_config(SchedulerType::kWarmupCosineLR, GetParam()), kBaseLr);
  for (int64_t k = -1; k <= kT + 20; ++k) {
    EXPECT_NEAR(warmup.lr(k), expected_warmup_lr(GetParam(), k), kTolerance) << "k=" << k;
    EXPECT_NEAR(decay.lr(k), expected_warmup_decay_lr(GetParam(), k), kTolerance) << "k=" << k;
    EXPECT_NEAR(cosine.lr(k), expected_warmup_cosine_lr(GetParam(), k), kTolerance) << "k=" << k;
  }
}

TEST_P(LrScheduleFormulas, FirstTwoStepsRunAtWarmupMinLr) {
  for (SchedulerType type : {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR}) {
    const LrSchedule s(make_config(type, GetParam()), kBaseLr);
    EXPECT_EQ(s.lr(-1), 0.01);
    EXPECT_EQ(s.lr(0), 0.01);
    EXPECT_GT(s.lr(1), 0.01);
  }
}

TEST_P(LrScheduleFormulas, WarmupDecayLrReachesZeroAtTotalStepsAndStays) {
  SchedulerConfig c = make_config(SchedulerType::kWarmupDecayLR, GetParam());
  c.warmup_min_lr = 0;
  const LrSchedule s(c, kBaseLr);
  EXPECT_GT(s.lr(kT - 1), 0.0);
  for (int64_t k = kT; k <= kT + 1000; ++k) ASSERT_EQ(s.lr(k), 0.0) << "k=" << k;
}

TEST_P(LrScheduleFormulas, WarmupCosineLrEndsAtCosMinRatio) {
  const LrSchedule s(make_config(SchedulerType::kWarmupCosineLR, GetParam()), kBaseLr);
  EXPECT_GT(s.lr(kT - 2), kBaseLr * 0.05);
  // Progress reaches 1 at k = T - 1 and is clamped there (DeepSpeed 0.19): no rise after the end.
  for (int64_t k = kT - 1; k <= kT + 1000; ++k) ASSERT_NEAR(s.lr(k), kBaseLr * 0.05, kTolerance) << "k=" << k;
}

INSTANTIATE_TEST_SUITE_P(WarmupTypes, LrScheduleFormulas, ::testing::Values("log", "linear"));

// Literal values below are worked out by hand.

TEST(LrSchedule, LinearWarmupLiterals) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_type = "linear";
  c.warmup_min_lr = 0;
  c.warmup_max_lr = 0.1;
  c.warmup_num_steps = 10;
  const LrSchedule s(c, 1.0);
  EXPECT_EQ(s.lr(-1), 0.0);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(1), 0.01, kTolerance);
  EXPECT_NEAR(s.lr(5), 0.05, kTolerance);
  EXPECT_NEAR(s.lr(9), 0.09, kTolerance);
  EXPECT_NEAR(s.lr(10), 0.1, kTolerance);
  EXPECT_NEAR(s.lr(100000), 0.1, kTolerance);
}

TEST(LrSchedule, LogWarmupLiterals) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_type = "log";
  c.warmup_min_lr = 0;
  c.warmup_max_lr = 0.1;
  c.warmup_num_steps = 10;
  const LrSchedule s(c, 1.0);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(2), 0.1 * 0.47712125471966244, kTolerance);  // log10(3)
  EXPECT_NEAR(s.lr(4), 0.1 * 0.69897000433601886, kTolerance);  // log10(5)
  EXPECT_NEAR(s.lr(9), 0.1, kTolerance);                        // log10(10): full lr one step early
  EXPECT_NEAR(s.lr(10), 0.1, kTolerance);
}

TEST(LrSchedule, WarmupMaxLrDefaultsToOptimizerLr) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_type = "linear";
  c.warmup_num_steps = 4;
  const LrSchedule s(c, 0.3);
  EXPECT_NEAR(s.lr(2), 0.15, kTolerance);
  EXPECT_NEAR(s.lr(4), 0.3, kTolerance);
}

TEST(LrSchedule, WarmupDecayMaxLrDefaultsToDeepSpeeds0_001) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupDecayLR;
  c.warmup_type = "linear";
  c.warmup_num_steps = 4;
  c.total_num_steps = 100;
  const LrSchedule s(c, 0.3);
  EXPECT_NEAR(s.lr(2), 0.0005, kTolerance);
  EXPECT_NEAR(s.lr(4), 0.001, kTolerance);
}

TEST(LrSchedule, WarmupNumStepsIsAtLeastTwo) {
  for (int64_t steps : {0, 1, 2}) {
    SchedulerConfig c;
    c.type = SchedulerType::kWarmupLR;
    c.warmup_type = "linear";
    c.warmup_max_lr = 1.0;
    c.warmup_num_steps = steps;
    const LrSchedule s(c, 0.5);
    EXPECT_EQ(s.lr(0), 0.0) << "steps=" << steps;
    EXPECT_NEAR(s.lr(1), 0.5, kTolerance) << "steps=" << steps;
    EXPECT_NEAR(s.lr(2), 1.0, kTolerance) << "steps=" << steps;
  }
}

TEST(LrSchedule, LinearWarmupDecayLiterals) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupDecayLR;
  c.warmup_type = "linear";
  c.warmup_min_lr = 0;
  c.warmup_max_lr = 0.1;
  c.warmup_num_steps = 10;
  c.total_num_steps = 20;
  const LrSchedule s(c, 1.0);
  EXPECT_NEAR(s.lr(5), 0.05, kTolerance);
  EXPECT_NEAR(s.lr(10), 0.1, kTolerance);
  EXPECT_NEAR(s.lr(15), 0.05, kTolerance);
  EXPECT_NEAR(s.lr(19), 0.01, kTolerance);
  EXPECT_EQ(s.lr(20), 0.0);
  EXPECT_EQ(s.lr(25), 0.0);
}

TEST(LrSchedule, WarmupDecayWithTotalBelowWarmupDropsToMinAfterWarmup) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupDecayLR;
  c.warmup_type = "linear";
  c.warmup_min_lr = 0.02;
  c.warmup_max_lr = 0.1;
  c.warmup_num_steps = 10;
  c.total_num_steps = 5;
  const LrSchedule s(c, 1.0);
  EXPECT_NEAR(s.lr(5), 0.06, kTolerance);  // still warming up
  EXPECT_EQ(s.lr(10), 0.02);
  EXPECT_EQ(s.lr(11), 0.02);
}

TEST(LrSchedule, LinearWarmupCosineLiterals) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupCosineLR;
  c.warmup_type = "linear";
  c.warmup_min_ratio = 0;
  c.warmup_num_steps = 10;
  c.total_num_steps = 20;
  c.cos_min_ratio = 0.1;
  const LrSchedule s(c, 0.2);
  EXPECT_EQ(s.lr(-1), 0.0);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(5), 0.1, kTolerance);
  // k = 10: p = 1/10, ratio = 0.1 + 0.9 (1 + cos(0.1 pi)) / 2 with cos(0.1 pi) = 0.95105651629515357.
  EXPECT_NEAR(s.lr(10), 0.2 * 0.97797543233281911, kTolerance);
  EXPECT_NEAR(s.lr(14), 0.11, kTolerance);  // p = 1/2: ratio 0.55
  EXPECT_NEAR(s.lr(19), 0.02, kTolerance);  // p = 1: ratio cos_min_ratio
  EXPECT_NEAR(s.lr(25), 0.02, kTolerance);  // clamped, not rising back
}

TEST(LrSchedule, CosineStartsAtZeroThenAtWarmupMinRatio) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupCosineLR;
  c.warmup_type = "log";
  c.warmup_min_ratio = 0.25;
  c.warmup_num_steps = 10;
  c.total_num_steps = 20;
  const LrSchedule s(c, 0.4);
  EXPECT_EQ(s.lr(-1), 0.0);
  EXPECT_NEAR(s.lr(0), 0.1, kTolerance);
}

TEST(LrSchedule, CosineWithTotalBelowWarmupStaysAtFloorAfterWarmup) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupCosineLR;
  c.warmup_type = "linear";
  c.warmup_num_steps = 10;
  c.total_num_steps = 4;
  c.cos_min_ratio = 0.5;
  const LrSchedule s(c, 1.0);
  EXPECT_NEAR(s.lr(10), 0.5, kTolerance);
  EXPECT_NEAR(s.lr(30), 0.5, kTolerance);
}

TEST(LrSchedule, NoneIsConstantBaseLr) {
  SchedulerConfig c;
  c.type = SchedulerType::kNone;
  c.warmup_max_lr = 0.9;
  const LrSchedule s(c, 3e-4);
  for (int64_t k : {-1, 0, 1, 999, 1000, 1000000}) EXPECT_EQ(s.lr(k), 3e-4) << "k=" << k;
}

TEST(LrSchedule, UnknownWarmupTypeIsRejected) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_type = "cosine";
  try {
    LrSchedule s(c, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("'cosine'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardkit::trainer
