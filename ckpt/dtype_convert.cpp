#include "ckpt/dtype_convert.hpp"

#include <algorithm>
#include <bit>

#include "base/vector_clones.hpp"

namespace shardkit::ckpt {
namespace {

constexpr uint32_t kF32SignMask = 0x8000'0000u;
constexpr uint32_t kF32AbsMask = 0x7fff'ffffu;
constexpr uint32_t kF32Inf = 0x7f80'0000u;
constexpr uint32_t kF32Implicit = 0x0080'0000u;  // the hidden leading 1 of a normal fp32
constexpr uint32_t kF32MantissaMask = 0x007f'ffffu;

constexpr uint16_t kF16Inf = 0x7c00;
constexpr uint16_t kF16QuietBit = 0x0200;
constexpr uint16_t kBF16QuietBit = 0x0040;

// fp32 bit patterns of the fp16 range boundaries.
constexpr uint32_t kF32TwoPow16 = 0x4780'0000u;         // 65536: the first magnitude past the fp16 grid
constexpr uint32_t kF32TwoPowM14 = 0x3880'0000u;        // 2^-14: the smallest normal fp16
constexpr uint32_t kF32TwoPowM25 = 0x3300'0000u;        // 2^-25: half the smallest subnormal fp16
constexpr uint32_t kRebias = uint32_t{127 - 15} << 23;  // fp32 bias minus fp16 bias, in exponent position

// Drops the low `shift` bits of `value` (1 <= shift <= 31), rounding to nearest with ties to even.
// A carry out of the kept bits is wanted: it moves a mantissa into the next binade (or to infinity).
constexpr uint32_t shift_right_round_even(uint32_t value, int shift) noexcept {
  const uint32_t kept = value >> shift;
  const uint32_t dropped = value & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  return kept + ((dropped > half || (dropped == half && (kept & 1u))) ? 1u : 0u);
}

// a where c holds, else b, by masks: GCC may turn nested conditional expressions into branches, and a
// loop with branches does not vectorise.
constexpr uint32_t pick(bool c, uint32_t a, uint32_t b) noexcept {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// The conversions themselves, internal so that the span forms below inline them: calls to the exported
// functions from position-independent code stay calls (another library may replace them), one per
// element, and a loop of calls does not vectorise.

inline uint16_t to_bf16(float x) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // bf16 is fp32 with the low 16 mantissa bits dropped; the sign bit rides along, and a carry out of
  // the exponent of the largest finite values correctly gives an infinity. Adding 0x7fff, plus one
  // when the kept part is odd, carries exactly when the dropped bits round up to nearest even: what
  // shift_right_round_even(bits, 16) gives, in a form whose loop runs 1.6x as fast vectorised (GCC 12,
  // AVX-512). The helper keeps its comparisons: fp32 -> fp16's scalar loop runs faster with them
  // (36-38 ms for 16.8 M elements, one thread, against 45-46 with this form).
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // Rounding a NaN could carry out of its payload (0x7fffffff would become -0), and dropping the low
  // bits of one whose payload lives there would leave an infinity: keep the top bits, force quiet.
  const uint32_t quiet_nan = (bits >> 16) | kBF16QuietBit;
  return static_cast<uint16_t>((bits & kF32AbsMask) > kF32Inf ? quiet_nan : rounded);
}

// Not inlined: with its branches inlined into the span form's loop, GCC 12 turned some into selects and
// the loop ran about 15 % slower than calling this.
[[gnu::noinline]] uint16_t to_fp16(float x) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const auto sign = static_cast<uint16_t>((bits & kF32SignMask) >> 16);
  const uint32_t abs = bits & kF32AbsMask;
  if (abs > kF32Inf) {
    // Keep the top 9 payload bits and force the quiet bit: the payload may live only in the low bits.
    return static_cast<uint16_t>(sign | kF16Inf | kF16QuietBit | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= kF32TwoPow16) return static_cast<uint16_t>(sign | kF16Inf);  // too large, or an infinity
  if (abs >= kF32TwoPowM14) {
    // Normal fp16 range: rebias the exponent, then drop 13 mantissa bits. Rounding up from 65504 (the
    // largest fp16) carries into the all-ones exponent with a zero mantissa, which is the infinity.
    return static_cast<uint16_t>(sign | shift_right_round_even(abs - kRebias, 13));
  }
  if (abs <= kF32TwoPowM25) return sign;  // rounds to zero (2^-25 itself is a tie, and zero is even)
  // Subnormal fp16: the value is m * 2^-24 with m < 1024. With the hidden bit made explicit, the fp32 is
  // significand * 2^(e - 150), so m = significand * 2^(e - 126): shift right by 126 - e (14..24 here).
  // Rounding 1023.5 up gives 1024, the bit pattern of the smallest normal: also right.
  const int exponent = static_cast<int>(abs >> 23);
  const uint32_t significand = (abs & kF32MantissaMask) | kF32Implicit;
  return static_cast<uint16_t>(sign | shift_right_round_even(significand, 126 - exponent));
}

inline float from_bf16(uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline float from_fp16(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  const uint32_t special = sign | kF32Inf | (mantissa << 13);  // inf or NaN
  const uint32_t normal = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  // A subnormal fp16 (m * 2^-24, zero included) is m converted and scaled by a power of two, both exact
  // in fp32, whose normal range holds the result. Every case computed and one picked: no branch or
  // loop, so a loop of it vectorises.
  const uint32_t subnormal = sign | std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f);
  return std::bit_cast<float>(pick(exponent == 0x1f, special, pick(exponent != 0, normal, subnormal)));
}

}  // namespace

uint16_t fp32_to_bf16(float x) noexcept {
  return to_bf16(x);
}
uint16_t fp32_to_fp16(float x) noexcept {
  return to_fp16(x);
}
float bf16_to_fp32(uint16_t h) noexcept {
  return from_bf16(h);
}
float fp16_to_fp32(uint16_t h) noexcept {
  return from_fp16(h);
}

// The bf16 forms and the fp16 widening at the machine's vector width: the optimizers narrow every
// updated weight each step, and checkpoints widen and narrow whole tensors. (fp32 -> fp16 has branches
// for its ranges; a form without them vectorised but ran slower, GCC 12 with AVX-512.)

SHARDKIT_VECTOR_CLONES void convert_fp32_to_bf16(std::span<const float> in, std::span<uint16_t> out) noexcept {
  const size_t n = std::min(in.size(), out.size());
  for (size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void convert_fp32_to_fp16(std::span<const float> in, std::span<uint16_t> out) noexcept {
  const size_t n = std::min(in.size(), out.size());
  for (size_t i = 0; i < n; ++i) out[i] = to_fp16(in[i]);
}

SHARDKIT_VECTOR_CLONES void convert_bf16_to_fp32(std::span<const uint16_t> in, std::span<float> out) noexcept {
  const size_t n = std::min(in.size(), out.size());
  for (size_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}

SHARDKIT_VECTOR_CLONES void convert_fp16_to_fp32(std::span<const uint16_t> in, std::span<float> out) noexcept {
  const size_t n = std::min(in.size(), out.size());
  for (size_t i = 0; i < n; ++i) out[i] = from_fp16(in[i]);
}

}  // namespace shardkit::ckpt
