// The polynomial 2^x of the sm_90 forward pass (model/cuda/exp2_poly.hpp), on the host: within its
// stated relative error wherever a probability can land, the clamp below 2^-125, and the integer part
// carried into the exponent exactly at the rounding's ties.
#include "model/cuda/exp2_poly.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace shardkit::model::cuda {
namespace {

constexpr double kBound = 7.5e-5;  // the minimax polynomial's relative error

double relative_error(float x) {
  const double exact = std::exp2(static_cast<double>(x));
  return std::abs(static_cast<double>(exp2_poly(x)) - exact) / exact;
}

TEST(Exp2Poly, WithinItsErrorFromZeroDownTo2ToTheMinus125) {
  double worst = 0;
  for (int i = 0; i <= 2'000'000; ++i) worst = std::max(worst, relative_error(-125.0f * static_cast<float>(i) / 2e6f));
  EXPECT_LT(worst, kBound);
  EXPECT_GT(worst, kBound / 2);  // the polynomial is the one measured, not an exact 2^x
}

TEST(Exp2Poly, CarriesTheIntegerPartAtTheRoundingTies) {
  // x = n + 1/2 rounds to the even neighbour: either way n + f is x, and the result must agree.
  for (int n = -124; n <= -1; ++n) {
    for (const float d : {-0.5f, 0.5f, std::nextafter(-0.5f, 0.0f), std::nextafter(0.5f, 0.0f)}) {
      const float x = static_cast<float>(n) + d;
      EXPECT_LT(relative_error(x), kBound) << "x = " << x;
    }
  }
  for (int n = -125; n <= 0; ++n) EXPECT_LT(relative_error(static_cast<float>(n)), kBound) << "x = " << n;
}

TEST(Exp2Poly, ClampsBelow2ToTheMinus125) {
  for (const float x : {-125.5f, -126.0f, -200.0f, -1e30f}) {
    const float y = exp2_poly(x);
    EXPECT_GT(y, 0.0f) << "x = " << x;
    EXPECT_LE(y, std::exp2(-124.0f)) << "x = " << x;
    EXPECT_TRUE(std::isnormal(y)) << "x = " << x;
  }
}

}  // namespace
}  // namespace shardkit::model::cuda
