// Conversions between fp32 and the 16-bit float formats a checkpoint exports to: bfloat16 (the top half
// of an fp32) and IEEE 754 binary16 ("fp16": 1 sign bit, 5 exponent bits with bias 15, 10 mantissa bits).
// Narrowing rounds to nearest, ties to even, as torch's .to(bfloat16/float16) does on CPU; NaN stays a
// NaN (quiet, sign and leading payload bits kept), infinities stay infinities, and fp16 overflow gives
// an infinity. Widening is exact. The 16-bit values are raw bit patterns in host order.
#pragma once

#include <cstdint>
#include <span>

namespace shardkit::ckpt {

// fp32 -> bf16: round to nearest even; a NaN gives a quiet NaN; values above the largest bf16 (which
// round past it) give an infinity.
uint16_t fp32_to_bf16(float x) noexcept;

// fp32 -> fp16: round to nearest even over normals and subnormals; magnitudes of 65520 and more give an
// infinity; magnitudes of 2^-25 and less give a (signed) zero; a NaN gives a quiet NaN.
uint16_t fp32_to_fp16(float x) noexcept;

// bf16 -> fp32 and fp16 -> fp32: exact, since every bf16/fp16 value is an fp32 value. A NaN keeps its
// sign and payload (moved to the top of the fp32 mantissa), so a signalling NaN stays signalling.
float bf16_to_fp32(uint16_t h) noexcept;
float fp16_to_fp32(uint16_t h) noexcept;

// Element-wise forms of the above. `in` and `out` should have the same length; when they do not, only
// the first min(in.size(), out.size()) elements are converted (the rest of `out` is left untouched).
void convert_fp32_to_bf16(std::span<const float> in, std::span<uint16_t> out) noexcept;
void convert_fp32_to_fp16(std::span<const float> in, std::span<uint16_t> out) noexcept;
void convert_bf16_to_fp32(std::span<const uint16_t> in, std::span<float> out) noexcept;
void convert_fp16_to_fp32(std::span<const uint16_t> in, std::span<float> out) noexcept;

}  // namespace shardkit::ckpt
