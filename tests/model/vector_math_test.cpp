// The CPU kernels' branch-free e^x and tanh(x) (model/cpu/vector_math.hpp) against the C library's
// double-precision functions: their stated errors over the whole range, the ends of the range, and the
// special values.
#include "model/cpu/vector_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardkit::model::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// |got - exact| in units of the last place of the float nearest to exact.
double ulps(float got, double exact) {
  const float nearest = static_cast<float>(exact);
  const double ulp = static_cast<double>(std::nextafter(std::abs(nearest), kInf) - std::abs(nearest));
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

TEST(VectorMath, ExpIsWithinTwoUlpOverTheNormalRange) {
  double worst = 0.0;
  constexpr int kSteps = 4'000'000;
  for (int i = 0; i <= kSteps; ++i) {
    const float x = -87.3f + 176.0f * static_cast<float>(i) / kSteps;
    worst = std::max(worst, ulps(exp_vec(x), std::exp(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 2.0);
  // Exact where the reduction leaves nothing to approximate.
  EXPECT_EQ(exp_vec(0.0f), 1.0f);
  EXPECT_EQ(exp_vec(-0.0f), 1.0f);
}

TEST(VectorMath, ExpAtTheEndsOfItsRange) {
  // The largest finite results: 2^128 would overflow as one power of two, the two halves do not.
  EXPECT_TRUE(std::isfinite(exp_vec(88.72f)));
  EXPECT_LT(ulps(exp_vec(88.72f), std::exp(static_cast<double>(88.72f))), 2.0);
  EXPECT_EQ(exp_vec(88.73f), kInf);
  EXPECT_EQ(exp_vec(kInf), kInf);
  // Below the smallest normal result: 0, not a clamped e^-87.3.
  EXPECT_GT(exp_vec(-87.3f), 0.0f);
  EXPECT_EQ(exp_vec(-87.4f), 0.0f);
  EXPECT_EQ(exp_vec(-1000.0f), 0.0f);
  EXPECT_EQ(exp_vec(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_vec(std::nanf(""))));
}

TEST(VectorMath, TanhIsWithinItsAbsoluteErrorAndOdd) {
  double worst = 0.0, worst_small = 0.0;
  constexpr int kSteps = 2'000'000;
  for (int i = -kSteps; i <= kSteps; ++i) {
    const float x = 12.0f * static_cast<float>(i) / kSteps;
    const double exact = std::tanh(static_cast<double>(x));
    const double err = std::abs(static_cast<double>(tanh_vec(x)) - exact);
    worst = std::max(worst, err);
    if (x != 0.0f && std::abs(x) < 0.125f) worst_small = std::max(worst_small, err / std::abs(exact));
    ASSERT_EQ(tanh_vec(-x), -tanh_vec(x)) << x;
  }
  EXPECT_LT(worst, 1e-7);
  EXPECT_LT(worst_small, 1e-7);  // relative, where the odd polynomial takes over
  EXPECT_EQ(tanh_vec(9.5f), 1.0f);
  EXPECT_EQ(tanh_vec(kInf), 1.0f);
  EXPECT_EQ(tanh_vec(-kInf), -1.0f);
  EXPECT_TRUE(std::signbit(tanh_vec(-0.0f)));
  EXPECT_TRUE(std::isnan(tanh_vec(std::nanf(""))));
}

}  // namespace
}  // namespace shardkit::model::cpu
