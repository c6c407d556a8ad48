// Element functions for the CPU kernels' loops: e^x and tanh(x) without calls or branches, so that a
// loop over them vectorises (the C library's expf and tanhf are calls, which keep a loop scalar), in
// an order of operations fixed by the code, so that every vector width gives the same bits where the
// file using them is compiled without fused multiply-adds.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace shardkit::model::cpu {

// e^x within 2 ulp over the normal range; 0 where e^x is below the smallest normal float (x <
// -87.34, -inf included), +inf above the largest (x > 88.72), NaN for NaN.
inline float exp_vec(float x) noexcept {
  constexpr float kLowest = -87.33654f, kHighest = 88.72284f;
  constexpr float kLog2e = 1.44269504f;
  // ln 2 in two parts, the first with zeros in its low bits, so that n * kLn2Hi is exact for |n| <= 128.
  constexpr float kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float xc = std::min(std::max(x, kLowest), kHighest);
  const float biased = xc * kLog2e + kRound;
  const float n = biased - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln(2) / 2
  // e^r by its Taylor series to r^7 / 7!: the remainder is below 5e-9 on |r| <= ln(2) / 2.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n for n in [-126, 128] as two normal powers of two, n = a + b with a = floor(n / 2): a single
  // one would overflow at n = 128, where e^x may still be finite.
  const int32_t ni = std::bit_cast<int32_t>(biased) - std::bit_cast<int32_t>(kRound);
  const int32_t a = ni >> 1, b = ni - a;
  const float two_a = std::bit_cast<float>(static_cast<uint32_t>(a + 127) << 23);
  const float two_b = std::bit_cast<float>(static_cast<uint32_t>(b + 127) << 23);
  const float y = (p * two_a) * two_b;
  return x < kLowest ? 0.0f : (x > kHighest ? std::numeric_limits<float>::infinity() : y);
}

// tanh(x) within 1e-7 absolute (a correctly rounded tanhf is within 3e-8 near +-1, so 1 + tanh(x), which
// GELU uses, loses no more than it would), within 1e-7 relative below |x| = 0.125, where it is an odd
// polynomial; exactly +-1 from where tanh rounds to it (|x| >= 9.011); odd.
inline float tanh_vec(float x) noexcept {
  const float a = std::abs(x);
  const float a2 = a * a;
  // tanh a = a - a^3/3 + 2 a^5/15 - 17 a^7/315 + ...: the next term is below 3e-10 a at a < 0.125.
  const float series = a + a * a2 * (-1.0f / 3.0f + a2 * (2.0f / 15.0f + a2 * (-17.0f / 315.0f)));
  const float e = exp_vec(2.0f * std::min(a, 10.0f));
  const float t = a < 0.125f ? series : 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(t, x);
}

}  // namespace shardkit::model::cpu
