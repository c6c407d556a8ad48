// 2^x computed with multiply-adds and one integer add, for the exponentials the special-function unit
// cannot keep up with. At head size 64 the sm_90 forward pass makes one exponential per score, and the
// unit does 16 a cycle per multiprocessor where the tensor cores finish a 64 x 128 tile's two products
// in about as many cycles as its 8,192 exponentials take: whatever share of them runs on the FMA pipe
// instead comes off the bound. FlashAttention-4 does the same on Blackwell.
// Plain C++ so that the host tests measure the same arithmetic the kernels run.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "base/host_device.hpp"

namespace shardkit::model::cuda {

// 2^x for x <= 0, within 7.5e-5 relative error (a bf16 probability is rounded to 3.9e-3) down to
// 2^-125; below that, 2^-125 (a probability beside the row's largest, 1, that no fp32 sum can hold).
// Not for masked scores: -inf gives 2^-125 here, not 0. x = n + f with n = round(x) (the fp32 add of
// 1.5 * 2^23 rounds x into the low bits of the sum), f in [-1/2, 1/2]; 2^f by a degree-3 minimax
// polynomial (relative error), and n added to its exponent bits.
SHARDKIT_HOST_DEVICE inline float exp2_poly(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float c0 = 0.99992806f, c1 = 0.69326097f, c2 = 0.24261113f, c3 = 0.055171669f;
  x = fmaxf(x, -125.0f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  const float p = fmaf(fmaf(fmaf(c3, f, c2), f, c1), f, c0);
  // The low bits of t hold n (two's complement): shifted into the exponent field, the add scales p by 2^n.
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p) + (std::bit_cast<uint32_t>(t) << 23));
}

}  // namespace shardkit::model::cuda
