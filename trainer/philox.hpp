// Counter-based random numbers (Philox4x32-10, Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC 2011): the same (key, counter) always gives the same output, so values can be drawn for
// any element independently, in any order, on any thread — and on a GPU: the functions here compile for
// the host and, under nvcc, for the device, and give the same bits on both.
//
// The same bits on both is why normal() does not call the math library: the host's and CUDA's log and
// cos differ in their last bits, which a rounding to float occasionally exposes. Its logarithm and
// cosine are written here in IEEE double operations that round the same way on both (+, -, *, / and
// sqrt, correctly rounded, never contracted into fused multiply-adds: on the device each is an
// explicitly rounded intrinsic; on the host the source that draws them is compiled without contraction).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "base/host_device.hpp"

namespace shardkit::trainer {

namespace philox_detail {

inline constexpr uint32_t kMultiplier0 = 0xD2511F53;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9;  // golden ratio
inline constexpr uint32_t kWeyl1 = 0xBB67AE85;  // sqrt(3) - 1
inline constexpr int kRounds = 10;
inline constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;

// Double operations, each rounded once, the same on the host and the device.
SHARDKIT_HOST_DEVICE inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
SHARDKIT_HOST_DEVICE inline double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
SHARDKIT_HOST_DEVICE inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
SHARDKIT_HOST_DEVICE inline double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
SHARDKIT_HOST_DEVICE inline double sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// One round: two 32x32 -> 64-bit products, their halves mixed with the other words and the key.
SHARDKIT_HOST_DEVICE inline void round(uint32_t c[4], const uint32_t k[2]) {
  const uint64_t product0 = uint64_t{kMultiplier0} * c[0];
  const uint64_t product1 = uint64_t{kMultiplier1} * c[2];
  const uint32_t c1 = c[1], c3 = c[3];
  c[0] = static_cast<uint32_t>(product1 >> 32) ^ c1 ^ k[0];
  c[1] = static_cast<uint32_t>(product1);
  c[2] = static_cast<uint32_t>(product0 >> 32) ^ c3 ^ k[1];
  c[3] = static_cast<uint32_t>(product0);
}

// The top 53 of 64 random bits, as an integer in [0, 2^53).
SHARDKIT_HOST_DEVICE inline uint64_t bits53(uint32_t high, uint32_t low) {
  return ((uint64_t{high} << 32) | low) >> 11;
}

// log(j * 2^-53) for an integer j in [1, 2^53]: j = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
// log(m) = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...) with s = (m - 1) / (m + 1), |s| < 0.172: eleven
// terms take the series below double precision's resolution.
SHARDKIT_HOST_DEVICE inline double log_dyadic(uint64_t j) {
#if defined(__CUDA_ARCH__)
  int e = 63 - __clzll(static_cast<long long>(j));  // j >= 1: e is the position of its leading bit
#else
  int e = 63 - std::countl_zero(j);
#endif
  // m = j / 2^e in [1, 2) exactly (j has at most 53 significant bits).
  double m = div(static_cast<double>(j), static_cast<double>(uint64_t{1} << e));
  if (m > 1.4142135623730951) {
    m = mul(m, 0.5);
    ++e;
  }
  const double s = div(sub(m, 1.0), add(m, 1.0));
  const double s2 = mul(s, s);
  double series = div(1.0, 23.0);
  for (int k = 10; k >= 0; --k) series = add(mul(series, s2), div(1.0, static_cast<double>(2 * k + 1)));
  constexpr double kLn2 = 0.69314718055994530942;
  return add(mul(static_cast<double>(e - 53), kLn2), mul(mul(2.0, s), series));
}

// sin(x) and cos(x) for x in [0, pi/4], by their Taylor series to x^17 and x^18.
SHARDKIT_HOST_DEVICE inline double sin_small(double x) {
  const double x2 = mul(x, x);
  double term = 1.0;
  for (int k = 8; k >= 1; --k) term = sub(1.0, div(mul(x2, term), static_cast<double>((2 * k) * (2 * k + 1))));
  return mul(x, term);
}
SHARDKIT_HOST_DEVICE inline double cos_small(double x) {
  const double x2 = mul(x, x);
  double term = 1.0;
  for (int k = 9; k >= 1; --k) term = sub(1.0, div(mul(x2, term), static_cast<double>((2 * k - 1) * (2 * k))));
  return term;
}

// cos(2 pi u) for u = k * 2^-53, k an integer in [0, 2^53): the quadrant and the reflection that keeps
// the argument in [0, pi/4] are taken on u itself, where they are exact.
SHARDKIT_HOST_DEVICE inline double cos_two_pi_dyadic(uint64_t k) {
  const uint64_t quarter = uint64_t{1} << 51;  // u = 1/4
  const auto quadrant = static_cast<int>(k >> 51);
  const uint64_t rest = k & (quarter - 1);  // 2 pi u = quadrant * pi/2 + (pi/2) * rest / quarter
  const bool reflect = rest > quarter / 2;  // past pi/4: use the complementary angle
  const uint64_t r = reflect ? quarter - rest : rest;
  constexpr double kHalfPi = 1.5707963267948966;
  const double x = mul(kHalfPi, mul(static_cast<double>(r), 1.0 / static_cast<double>(quarter)));
  // cos(q pi/2 + y): q = 0: cos y, 1: -sin y, 2: -cos y, 3: sin y; y = pi/2 - x when reflected.
  const bool use_cos = (quadrant % 2 == 0) != reflect;
  const double v = use_cos ? cos_small(x) : sin_small(x);
  return (quadrant == 1 || quadrant == 2) ? -v : v;
}

}  // namespace philox_detail

struct Philox {
  // Four 32-bit outputs for a 128-bit counter under a 64-bit key.
  SHARDKIT_HOST_DEVICE static void generate(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, uint32_t out[4]) {
    uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
    out[0] = static_cast<uint32_t>(counter_lo);
    out[1] = static_cast<uint32_t>(counter_lo >> 32);
    out[2] = static_cast<uint32_t>(counter_hi);
    out[3] = static_cast<uint32_t>(counter_hi >> 32);
    for (int r = 0; r < philox_detail::kRounds; ++r) {
      if (r > 0) {  // the first round uses the key itself; each later one bumps it by the Weyl constants
        k[0] += philox_detail::kWeyl0;
        k[1] += philox_detail::kWeyl1;
      }
      philox_detail::round(out, k);
    }
  }

  // A uniform double in [0, 1) from (key, counter_lo, counter_hi).
  SHARDKIT_HOST_DEVICE static double uniform(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) {
    uint32_t out[4];
    generate(key, counter_lo, counter_hi, out);
    return static_cast<double>(philox_detail::bits53(out[1], out[0])) * philox_detail::kTwoPowMinus53;
  }

  // A standard normal float from (key, counter_lo, counter_hi): Box-Muller on one Philox block,
  // sqrt(-2 log u1) cos(2 pi u2) with u1 in (0, 1] (log finite) and u2 in [0, 1). The sine partner is
  // dropped so that the value stays a function of (key, counter) alone.
  SHARDKIT_HOST_DEVICE static float normal(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) {
    using namespace philox_detail;
    uint32_t out[4];
    generate(key, counter_lo, counter_hi, out);
    const uint64_t j = (uint64_t{1} << 53) - bits53(out[1], out[0]);  // u1 = j * 2^-53
    const double radius = philox_detail::sqrt(mul(-2.0, log_dyadic(j)));
    return static_cast<float>(mul(radius, cos_two_pi_dyadic(bits53(out[3], out[2]))));
  }
};

}  // namespace shardkit::trainer
