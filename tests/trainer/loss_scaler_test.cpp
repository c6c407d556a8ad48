#include "trainer/loss_scaler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

// DeepSpeed 0.19's dynamic-scaling algorithm (its growth rule), transcribed line by line.
struct ReferenceScaler {
  double cur_scale;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  double scale_factor = 2.0;
  int64_t scale_window;
  double min_scale;
  int delayed_shift;
  int cur_hysteresis;
  bool consecutive_hysteresis;

  // Returns false, changing nothing, where DeepSpeed raises (overflow at the minimum scale).
  bool update(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale) return false;
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      const int64_t s = cur_iter - last_overflow_iter - 1;
      if (s > 0 && s % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
    return true;
  }

  LossScalerState state() const { return {cur_scale, cur_iter, last_overflow_iter, cur_hysteresis}; }
};

std::string describe(const LossScalerState& s) {
  std::ostringstream out;
  out << "{scale " << s.cur_scale << ", iter " << s.cur_iter << ", last overflow " << s.last_overflow_iter
      << ", hysteresis " << s.cur_hysteresis << "}";
  return out.str();
}

Fp16Config dynamic_fp16(int initial_scale_power, int64_t window, int hysteresis, bool consecutive = false) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 0;
  c.initial_scale_power = initial_scale_power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = 1;
  return c;
}

// Runs `updates` updates with the given overflow pattern and returns the scale after each (1-based).
template <typename Pattern>
std::vector<double> scales_after(LossScaler& scaler, int updates, Pattern overflow_at) {
  std::vector<double> scales;
  for (int i = 1; i <= updates; ++i) {
    scaler.update(overflow_at(i));
    scales.push_back(scaler.scale());
  }
  return scales;
}

class LossScalerAgainstReference : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(LossScalerAgainstReference, FullStateMatchesAfterEveryUpdate) {
  const auto [hysteresis, consecutive] = GetParam();
  Fp16Config config = dynamic_fp16(5, 7, hysteresis, consecutive);
  config.min_loss_scale = 3;  // not a power of two: exercises the max(scale / 2, min) clamp
  LossScaler scaler(config, false);
  ReferenceScaler ref{32.0, 0, -1, 2.0, 7, 3.0, hysteresis, hysteresis, consecutive};
  ASSERT_TRUE(scaler.state() == ref.state()) << describe(scaler.state()) << " vs " << describe(ref.state());

  // Phases of 100 updates alternate between rare (2%) and frequent (60%) overflows, so the scale both
  // climbs over many windows and falls to its minimum.
  std::mt19937 rng(12345 + 10 * hysteresis + consecutive);
  int grown = 0, shrunk = 0, absorbed = 0, at_minimum = 0;
  for (int i = 0; i < 5000; ++i) {
    const uint32_t per_mille = (i / 100) % 2 == 0 ? 20 : 600;
    const bool overflow = rng() % 1000 < per_mille;
    const LossScalerState before = ref.state();
    if (ref.update(overflow)) {
      scaler.update(overflow);
    } else {
      ++at_minimum;
      EXPECT_THROW(scaler.update(overflow), Error) << "update " << i;
    }
    const LossScalerState after = ref.state();
    grown += after.cur_scale > before.cur_scale;
    shrunk += after.cur_scale < before.cur_scale;
    absorbed += after.cur_hysteresis < before.cur_hysteresis;
    ASSERT_TRUE(scaler.state() == after) << "update " << i << " (overflow " << overflow << "): got "
                                         << describe(scaler.state()) << ", expected " << describe(after);
  }
  // The sequence must have exercised every branch, or the comparison proves little.
  EXPECT_GT(grown, 10);
  EXPECT_GT(shrunk, 10);
  EXPECT_GT(at_minimum, 0);
  if (hysteresis > 1) {
    EXPECT_GT(absorbed, 10);
  }
}

INSTANTIATE_TEST_SUITE_P(HysteresisAndConsecutive, LossScalerAgainstReference,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

TEST(LossScaler, DynamicStartsFromConfig) {
  const LossScaler scaler(Fp16Config{.enabled = true}, false);  // DeepSpeed 0.19 defaults
  EXPECT_TRUE(scaler.dynamic());
  EXPECT_TRUE(scaler.checks_overflow());
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.state(), (LossScalerState{65536.0, 0, -1, 2}));
}

TEST(LossScaler, WindowThreeDoublesAfterFourCleanUpdatesThenEveryThree) {
  LossScaler scaler(dynamic_fp16(4, 3, 1), false);
  // From the start (last overflow -1): the 4th clean update (cur_iter 3) doubles, then every 3rd.
  EXPECT_EQ(scales_after(scaler, 7, [](int) { return false; }), (std::vector<double>{16, 16, 16, 32, 32, 32, 64}));
  // An overflow halves at once; the 4th clean update after it doubles again.
  EXPECT_EQ(scales_after(scaler, 8, [](int i) { return i == 1; }),
            (std::vector<double>{32, 32, 32, 32, 64, 64, 64, 128}));
}

TEST(LossScaler, HysteresisTwoHalvesOnSecondOverflow) {
  LossScaler scaler(dynamic_fp16(4, 1000, 2), false);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 16.0);
  EXPECT_EQ(scaler.state().cur_hysteresis, 1);
  scaler.update(false);  // without consecutive_hysteresis a clean step does not refill
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.state().last_overflow_iter, 2);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnCleanStep) {
  LossScaler scaler(dynamic_fp16(4, 1000, 2, /*consecutive=*/true), false);
  scaler.update(true);
  scaler.update(false);  // refills cur_hysteresis to 2
  EXPECT_EQ(scaler.state().cur_hysteresis, 2);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(true);  // two overflows in a row
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(LossScaler, StaticFp16NeverChangesScale) {
  Fp16Config config;
  config.enabled = true;
  config.loss_scale = 128;
  LossScaler scaler(config, false);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(scaler.checks_overflow());
  for (int i = 0; i < 100; ++i) scaler.update(i % 3 == 0);
  EXPECT_EQ(scaler.scale(), 128.0);
  EXPECT_EQ(scaler.state().cur_iter, 100);
}

TEST(LossScaler, Bf16IsStaticOneWithOverflowChecks) {
  LossScaler scaler(Fp16Config{}, true);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(scaler.checks_overflow());
  for (int i = 0; i < 100; ++i) scaler.update(i % 2 == 0);
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_EQ(scaler.state().cur_iter, 100);
}

TEST(LossScaler, Fp32IsDisabled) {
  LossScaler scaler(Fp16Config{}, false);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_FALSE(scaler.checks_overflow());
  scaler.update(true);
  scaler.update(false);
  EXPECT_EQ(scaler.state(), (LossScalerState{1.0, 2, -1, 1}));
}

TEST(LossScaler, OverflowAtMinimumScaleThrows) {
  LossScaler scaler(dynamic_fp16(1, 1000, 1), false);
  scaler.update(true);  // 2 -> 1 = min_loss_scale
  EXPECT_EQ(scaler.scale(), 1.0);
  try {
    scaler.update(true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("loss scale already at its minimum (1)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(scaler.state(), (LossScalerState{1.0, 1, 0, 1}));  // the failed update changed nothing
}

TEST(LossScaler, HysteresisDelaysTheMinimumScaleError) {
  LossScaler scaler(dynamic_fp16(0, 1000, 2), false);
  EXPECT_NO_THROW(scaler.update(true));
  EXPECT_THROW(scaler.update(true), Error);
}

TEST(LossScaler, InvalidConfigIsRejected) {
  Fp16Config zero_window = dynamic_fp16(16, 0, 2);
  Fp16Config zero_hysteresis = dynamic_fp16(16, 1000, 0);
  Fp16Config zero_min = dynamic_fp16(16, 1000, 2);
  zero_min.min_loss_scale = 0;
  Fp16Config huge_power = dynamic_fp16(2000, 1000, 2);
  Fp16Config negative_static = dynamic_fp16(16, 1000, 2);
  negative_static.loss_scale = -4;
  for (const Fp16Config& c : {zero_window, zero_hysteresis, zero_min, huge_power, negative_static}) {
    try {
      LossScaler scaler(c, false);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    }
  }
  EXPECT_THROW(LossScaler(Fp16Config{.enabled = true}, true), Error);  // fp16 and bf16 together
}

TEST(LossScaler, JsonRoundTrip) {
  LossScaler scaler(dynamic_fp16(8, 3, 3), false);
  for (int i = 0; i < 20; ++i) scaler.update(i % 5 == 2);
  const nlohmann::json j = scaler.to_json();
  EXPECT_EQ(j.size(), 4u);
  EXPECT_EQ(j.at("cur_iter"), 20);
  EXPECT_EQ(j.at("last_overflow_iter"), 17);

  LossScaler restored(dynamic_fp16(8, 3, 3), false);
  restored.from_json(nlohmann::json::parse(j.dump()), "state.json");
  EXPECT_EQ(restored.state(), scaler.state());
  // Both continue identically.
  scaler.update(false);
  restored.update(false);
  EXPECT_EQ(restored.state(), scaler.state());
}

TEST(LossScaler, MalformedJsonIsRejected) {
  const nlohmann::json good = {
      {"cur_scale", 1024.0}, {"cur_iter", 10}, {"last_overflow_iter", 4}, {"cur_hysteresis", 2}};
  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[key] = value;
    return j;
  };
  nlohmann::json missing = good;
  missing.erase("cur_hysteresis");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const nlohmann::json bad[] = {with("cur_scale", -1024.0),
                                with("cur_scale", 0.0),
                                with("cur_scale", nan),
                                with("cur_scale", inf),
                                with("cur_scale", "1024"),
                                with("cur_iter", 10.5),
                                with("cur_iter", -1),
                                with("last_overflow_iter", 10),  // not before cur_iter
                                with("cur_hysteresis", 0),
                                missing,
                                nlohmann::json::array({1024.0, 10, 4, 2})};

  LossScaler scaler(dynamic_fp16(4, 7, 2), false);
  const LossScalerState before = scaler.state();
  for (const nlohmann::json& j : bad) {
    try {
      scaler.from_json(j, "ckpt/trainer_state.json");
      FAIL() << "accepted " << j.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("ckpt/trainer_state.json: loss scaler state: ", 0), 0u) << e.what();
    }
    EXPECT_EQ(scaler.state(), before) << "a rejected state must leave the scaler unchanged";
  }
  scaler.from_json(good, "ckpt/trainer_state.json");
  EXPECT_EQ(scaler.state(), (LossScalerState{1024.0, 10, 4, 2}));
}

}  // namespace
}  // namespace shardkit::trainer
