#include "ckpt/dtype_convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace shardkit::ckpt {
namespace {

// ---- Reference decoders, written from the IEEE definitions (not from the code under test) ----------

// fp16: sign, 5-bit exponent (bias 15), 10-bit mantissa. Exponent 0: subnormal m * 2^-24; otherwise
// (1024 + m) * 2^(e - 25). Only for finite patterns (exponent != 31).
double ref_fp16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double magnitude = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// bf16: sign, 8-bit exponent (bias 127), 7-bit mantissa. Exponent 0: subnormal m * 2^-133; otherwise
// (128 + m) * 2^(e - 134). Only for finite patterns (exponent != 255).
double ref_bf16_value(uint16_t h) {
  const int e = (h >> 7) & 0xff;
  const int m = h & 0x7f;
  const double magnitude = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Round-to-nearest-even onto a 16-bit format, by search: the non-negative finite codes 0..inf_code-1
// increase with their values, and the infinity code stands, for rounding, for the next binade's first
// value (IEEE rounds as if the exponent were unbounded, then overflows). Picks the nearer neighbour of
// |x|, the even code on a tie. The differences are exact in double: both neighbours lie within one
// 16-bit spacing of x, and x has a 24-bit significand.
uint16_t ref_round(float x, uint16_t inf_code, double beyond_max, double (*value)(uint16_t)) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  auto val = [&](uint32_t code) { return code == inf_code ? beyond_max : value(static_cast<uint16_t>(code)); };
  if (a >= beyond_max) return sign | inf_code;
  uint32_t lo = 0, hi = inf_code;  // invariant: val(lo) <= a < val(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (val(mid) <= a ? lo : hi) = mid;
  }
  const double below = a - val(lo);
  const double above = val(hi) - a;
  const uint32_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

uint16_t ref_fp32_to_fp16(float x) {
  return ref_round(x, 0x7c00, 65536.0, ref_fp16_value);
}
uint16_t ref_fp32_to_bf16(float x) {
  return ref_round(x, 0x7f80, std::ldexp(1.0, 128), ref_bf16_value);
}

float from_bits(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
bool fp16_is_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
bool bf16_is_nan(uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

// ---- Widening ------------------------------------------------------------------------------------

TEST(DtypeConvert, Fp16ToFp32MatchesTheIeeeDefinitionForAllPatterns) {
  int checked = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float got = fp16_to_fp32(h);
    const bool negative = (h & 0x8000) != 0;
    ASSERT_EQ(std::signbit(got), negative) << std::hex << h;
    if ((h & 0x7c00) == 0x7c00) {
      if ((h & 0x3ff) == 0) {
        ASSERT_TRUE(std::isinf(got)) << std::hex << h;
      } else {
        ASSERT_TRUE(std::isnan(got)) << std::hex << h;
        // The payload moves to the top of the fp32 mantissa.
        ASSERT_EQ((bits_of(got) >> 13) & 0x3ffu, h & 0x3ffu) << std::hex << h;
      }
    } else {
      const double expected = ref_fp16_value(h);
      ASSERT_EQ(bits_of(got), bits_of(static_cast<float>(expected))) << std::hex << h << " " << expected;
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << h;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

TEST(DtypeConvert, Bf16ToFp32MatchesTheDefinitionForAllPatterns) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float got = bf16_to_fp32(h);
    // bf16 is the top half of an fp32, NaN payloads included.
    ASSERT_EQ(bits_of(got), i << 16) << std::hex << h;
    if ((h & 0x7f80) != 0x7f80) {
      ASSERT_EQ(static_cast<double>(got), ref_bf16_value(h)) << std::hex << h;
    }
  }
}

TEST(DtypeConvert, KnownWideningValues) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(bits_of(fp16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xc2f7), -123.5f);
}

// ---- Narrowing: hand-picked cases ---------------------------------------------------------------------

TEST(DtypeConvert, Fp16RoundsTiesToEven) {
  const float one = 1.0f;
  EXPECT_EQ(fp32_to_fp16(one), 0x3c00);
  // fp16 spacing at 1 is 2^-10: 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd).
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2*2^-10 (even): rounds up.
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just off the ties, rounding goes to the nearer value.
  EXPECT_EQ(fp32_to_fp16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(fp32_to_fp16(std::nextafter(1.0f + 3 * std::ldexp(1.0f, -11), 0.0f)), 0x3c01);
  EXPECT_EQ(fp32_to_fp16(-(1.0f + 3 * std::ldexp(1.0f, -11))), 0xbc02);
  // Carry out of the mantissa into the exponent: just below 2 rounds to 2.
  EXPECT_EQ(fp32_to_fp16(2.0f - std::ldexp(1.0f, -12)), 0x4000);
}

TEST(DtypeConvert, Bf16RoundsTiesToEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  // bf16 spacing at 1 is 2^-7.
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(fp32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(fp32_to_bf16(-(1.0f + 3 * std::ldexp(1.0f, -8))), 0xbf82);
  EXPECT_EQ(fp32_to_bf16(2.0f - std::ldexp(1.0f, -10)), 0x4000);
}

TEST(DtypeConvert, Fp16OverflowGoesToInfinity) {
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7bff);  // below the midpoint 65520
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);    // the tie goes to the even neighbour, 65536 = infinity
  EXPECT_EQ(fp32_to_fp16(65536.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-1e6f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(DtypeConvert, Bf16OverflowGoesToInfinity) {
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);  // below the midpoint: largest finite bf16
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7f7f8000)), 0x7f80);  // the tie rounds to even: infinity
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(DtypeConvert, Fp16UnderflowGivesSubnormalsAndZero) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  EXPECT_EQ(fp32_to_fp16(tiny), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24: zero is even
  EXPECT_EQ(fp32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(fp32_to_fp16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 * 2^-24: tie, 2 is even
  EXPECT_EQ(fp32_to_fp16(5 * std::ldexp(1.0f, -25)), 0x0002);  // 2.5 * 2^-24: tie, 2 is even
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff);   // largest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);   // tie with the smallest normal (even)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -30)), 0x0000);
}

TEST(DtypeConvert, Bf16KeepsFp32Subnormals) {
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00010000)), 0x0001);  // a bf16 subnormal
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008000)), 0x0000);  // tie with zero
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008001)), 0x0001);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(DtypeConvert, SignedZerosKeepTheirSign) {
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
}

TEST(DtypeConvert, NanStaysNan) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  // Signalling NaNs whose payload sits only in the bits that narrowing drops: truncation would give inf.
  const std::vector<uint32_t> nans = {bits_of(quiet), 0x7f800001u, 0xff800001u, 0x7fc00000u,
                                      0x7fffffffu,    0xffffffffu, 0x7f801fffu, 0x7f80ffffu};
  for (const uint32_t bits : nans) {
    const float x = from_bits(bits);
    const uint16_t h = fp32_to_fp16(x);
    const uint16_t b = fp32_to_bf16(x);
    EXPECT_TRUE(fp16_is_nan(h)) << std::hex << bits << " -> " << h;
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
    EXPECT_EQ(b & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
    // Quiet results, so no later operation traps.
    EXPECT_NE(h & 0x0200, 0) << std::hex << bits;
    EXPECT_NE(b & 0x0040, 0) << std::hex << bits;
    EXPECT_TRUE(std::isnan(fp16_to_fp32(h)));
    EXPECT_TRUE(std::isnan(bf16_to_fp32(b)));
  }
}

// ---- Narrowing against the double-arithmetic reference -------------------------------------------

TEST(DtypeConvert, RandomBitPatternsMatchTheReference) {
  std::mt19937 rng(20240611);
  int compared = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp32_to_fp16(x), ref_fp32_to_fp16(x)) << std::hex << bits_of(x);
    ASSERT_EQ(fp32_to_bf16(x), ref_fp32_to_bf16(x)) << std::hex << bits_of(x);
    ++compared;
  }
  EXPECT_GT(compared, 1000000);
}

TEST(DtypeConvert, RandomFloatsInTheFp16RangeMatchTheReference) {
  // Uniform bit patterns rarely land where fp16 is interesting: draw exponents from 2^-27 to 2^16, and
  // mantissas that are often exactly on or next to a rounding boundary.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> exponent(127 - 27, 127 + 16);
  for (int i = 0; i < (1 << 20); ++i) {
    uint32_t mantissa = rng() & 0x7fffffu;
    switch (i % 4) {
      case 0:
        mantissa = (mantissa & ~0x1fffu) | 0x1000u;
        break;  // a tie for normal fp16
      case 1:
        mantissa = (mantissa & ~0x1fffu) | (0x1000u + (rng() % 3) - 1);
        break;  // next to a tie
      default:
        break;
    }
    const uint32_t bits = ((rng() & 1u) << 31) | (exponent(rng) << 23) | mantissa;
    const float x = from_bits(bits);
    ASSERT_EQ(fp32_to_fp16(x), ref_fp32_to_fp16(x)) << std::hex << bits;
  }
}

TEST(DtypeConvert, RandomFloatsNearBf16TiesMatchTheReference) {
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 20); ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2 == 0) bits = (bits & ~0xffffu) | (0x8000u + (rng() % 3) - 1);  // on or next to a tie
    const float x = from_bits(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp32_to_bf16(x), ref_fp32_to_bf16(x)) << std::hex << bits;
  }
}

#if defined(__FLT16_MAX__)
// A second, independent oracle: the compiler's own float -> _Float16 conversion (correctly rounded),
// over a dense sample of every binade that matters to fp16.
TEST(DtypeConvert, Fp16MatchesTheCompilersFloat16) {
  for (uint32_t bits = 0x32000000u; bits < 0x47900000u; bits += 97) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const float x = from_bits(bits | sign);
      const _Float16 h = static_cast<_Float16>(x);
      ASSERT_EQ(fp32_to_fp16(x), std::bit_cast<uint16_t>(h)) << std::hex << (bits | sign);
    }
  }
}
#endif

// ---- Round trips and the span forms ----------------------------------------------------------------

TEST(DtypeConvert, RoundTripsAreIdentitiesForAllNonNanPatterns) {
  int checked = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    if (!fp16_is_nan(h)) {
      ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(h)), h) << std::hex << h;
      ++checked;
    } else {
      ASSERT_TRUE(fp16_is_nan(fp32_to_fp16(fp16_to_fp32(h)))) << std::hex << h;
    }
    if (!bf16_is_nan(h)) {
      ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(h)), h) << std::hex << h;
      ++checked;
    } else {
      ASSERT_TRUE(bf16_is_nan(fp32_to_bf16(bf16_to_fp32(h)))) << std::hex << h;
    }
  }
  EXPECT_EQ(checked, (65536 - 2046) + (65536 - 254));  // all but the NaN patterns (both signs) of each format
}

TEST(DtypeConvert, SpanFormsConvertEachElement) {
  const std::vector<float> in = {1.0f, -2.5f, 65520.0f, 1.0f + 3 * std::ldexp(1.0f, -11), 0.0f};
  std::vector<uint16_t> half(in.size()), brain(in.size());
  convert_fp32_to_fp16(in, half);
  convert_fp32_to_bf16(in, brain);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(half[i], fp32_to_fp16(in[i])) << i;
    EXPECT_EQ(brain[i], fp32_to_bf16(in[i])) << i;
  }
  std::vector<float> back_half(in.size()), back_brain(in.size());
  convert_fp16_to_fp32(half, back_half);
  convert_bf16_to_fp32(brain, back_brain);
  EXPECT_EQ(back_half[1], -2.5f);
  EXPECT_TRUE(std::isinf(back_half[2]));
  EXPECT_EQ(back_brain[0], 1.0f);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(back_half[i], fp16_to_fp32(half[i])) << i;
    EXPECT_EQ(back_brain[i], bf16_to_fp32(brain[i])) << i;
  }
}

TEST(DtypeConvert, SpanFormsStopAtTheShorterSpan) {
  const std::vector<float> in = {1.0f, 2.0f, 3.0f};
  std::vector<uint16_t> out(2, 0xabcd);
  convert_fp32_to_fp16(in, out);
  EXPECT_EQ(out[0], 0x3c00);
  EXPECT_EQ(out[1], 0x4000);
  std::vector<uint16_t> longer(4, 0xabcd);
  convert_fp32_to_bf16(in, longer);
  EXPECT_EQ(longer[2], 0x4040);
  EXPECT_EQ(longer[3], 0xabcd);  // untouched
}

}  // namespace
}  // namespace shardkit::ckpt
