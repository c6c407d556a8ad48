// Philox: the known answers of the generator, the distributions drawn from it, and the accuracy of the
// normal draw's own logarithm and cosine against the math library's.
#include "trainer/philox.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>

namespace shardkit::trainer {
namespace {

struct KnownAnswer {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123's kat_vectors, philox4x32_10.
TEST(Philox, MatchesRandom123KnownAnswers) {
  const KnownAnswer cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const KnownAnswer& c : cases) {
    const uint64_t key = (uint64_t{c.key[1]} << 32) | c.key[0];
    const uint64_t counter_lo = (uint64_t{c.counter[1]} << 32) | c.counter[0];
    const uint64_t counter_hi = (uint64_t{c.counter[3]} << 32) | c.counter[2];
    uint32_t out[4];
    Philox::generate(key, counter_lo, counter_hi, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], c.expected[i]) << "word " << i << " for key " << std::hex << key;
  }
}

TEST(Philox, UniformLiesInUnitIntervalWithMeanOneHalf) {
  constexpr int kDraws = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = Philox::uniform(42, static_cast<uint64_t>(i), 7);
    ASSERT_GE(u, 0.0) << "draw " << i;
    ASSERT_LT(u, 1.0) << "draw " << i;
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / kDraws;
  EXPECT_NEAR(mean, 0.5, 0.01);                                 // standard error ~0.001
  EXPECT_NEAR(sum_sq / kDraws - mean * mean, 1.0 / 12, 0.005);  // variance of U(0, 1)
  EXPECT_EQ(Philox::uniform(42, 3, 7), Philox::uniform(42, 3, 7));
  EXPECT_NE(Philox::uniform(42, 3, 7), Philox::uniform(43, 3, 7));
}

TEST(Philox, NormalHasZeroMeanAndUnitVariance) {
  constexpr int kDraws = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double z = Philox::normal(1234, static_cast<uint64_t>(i), 0);
    ASSERT_TRUE(std::isfinite(z)) << "draw " << i;
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / kDraws;
  EXPECT_NEAR(mean, 0.0, 0.02);  // standard error ~0.003
  EXPECT_NEAR(sum_sq / kDraws - mean * mean, 1.0, 0.03);
  EXPECT_EQ(Philox::normal(1234, 5, 0), Philox::normal(1234, 5, 0));
}

// normal() computes its logarithm and cosine itself (so that a GPU draws the same bits); against
// Box-Muller with the math library in long double on the same 106 random bits, it may differ by the
// last bit of the float at most.
TEST(Philox, NormalIsBoxMullerToTheLastBitOfAFloat) {
  constexpr int kDraws = 2'000'000;
  int differing = 0;
  for (int i = 0; i < kDraws; ++i) {
    const auto counter = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;  // spread over the counter space
    uint32_t out[4];
    Philox::generate(77, counter, 3, out);
    const auto bits = [](uint32_t high, uint32_t low) { return ((uint64_t{high} << 32) | low) >> 11; };
    const long double u1 = 1.0L - static_cast<long double>(bits(out[1], out[0])) / 9007199254740992.0L;
    const long double u2 = static_cast<long double>(bits(out[3], out[2])) / 9007199254740992.0L;
    const long double exact = std::sqrt(-2.0L * std::log(u1)) * std::cos(2.0L * std::numbers::pi_v<long double> * u2);
    const float mine = Philox::normal(77, counter, 3);
    const float nearest = static_cast<float>(exact);
    ASSERT_LE(std::fabs(mine - nearest), std::fabs(std::nextafter(nearest, 2.0f * nearest + 1.0f) - nearest))
        << "draw " << i << ": " << mine << " against " << nearest;
    differing += mine != nearest;
  }
  EXPECT_LT(differing, kDraws / 1000) << "the last bit differs too often";
}

TEST(Philox, NormalCoversTheEndsOfItsInputs) {
  // The largest radius (u1 = 2^-53) and angles on the quadrant boundaries, where the reduction switches.
  using namespace philox_detail;
  EXPECT_NEAR(log_dyadic(1), -53 * std::numbers::ln2, 1e-13);
  EXPECT_EQ(log_dyadic(uint64_t{1} << 53), 0.0);
  const double on_axes[] = {1, 0, -1, 0};  // exact: the quadrant is taken on u itself
  const auto exact = [](uint64_t k) {
    return static_cast<double>(std::cos(2 * std::numbers::pi_v<long double> * static_cast<long double>(k) / 0x1p53L));
  };
  const uint64_t eighth = uint64_t{1} << 50;  // where the reflection starts
  for (int q = 0; q < 4; ++q) {
    const uint64_t k = static_cast<uint64_t>(q) << 51;
    EXPECT_EQ(cos_two_pi_dyadic(k), on_axes[q]) << q;
    for (const uint64_t at : {k + 1, k + eighth - 1, k + eighth, k + eighth + 1, k + 2 * eighth - 1}) {
      EXPECT_NEAR(cos_two_pi_dyadic(at), exact(at), 3e-16) << q << " " << at;
    }
  }
}

}  // namespace
}  // namespace shardkit::trainer
