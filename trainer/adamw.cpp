#include "trainer/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "ckpt/dtype_convert.hpp"

namespace shardkit::trainer {
namespace {

// Elements per unit of work: large enough to amortise scheduling, small enough (4 arrays x 64 KiB)
// that the narrowing pass finds the block's weights still in cache.
constexpr int64_t kBlock = 16384;

// The element-wise update. On x86-64 the compiler emits AVX-512, AVX2 and baseline versions and the
// loader picks the best the CPU has, so one binary runs everywhere at the machine's vector width.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void update_block(float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict grad,
                  int64_t n, AdamWCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1, one_minus_beta2 = 1.0f - c.beta2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * c.grad_multiplier + c.l2 * w[i];
    const float mi = c.beta1 * m[i] + one_minus_beta1 * g;
    const float vi = c.beta2 * v[i] + one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    float wi = w[i] - c.decay * w[i];
    wi -= c.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
  }
}

}  // namespace

AdamWCoefficients AdamWCoefficients::of(const AdamWStep& s) {
  const double bc1 = s.bias_correction ? 1.0 - std::pow(s.beta1, static_cast<double>(s.step)) : 1.0;
  const double bc2 = s.bias_correction ? 1.0 - std::pow(s.beta2, static_cast<double>(s.step)) : 1.0;
  AdamWCoefficients c{};
  c.beta1 = static_cast<float>(s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.eps = static_cast<float>(s.eps);
  c.step_size = static_cast<float>(s.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.grad_multiplier = static_cast<float>(s.grad_multiplier);
  c.decay = s.adam_w_mode ? static_cast<float>(s.lr) * static_cast<float>(s.weight_decay) : 0.0f;
  c.l2 = s.adam_w_mode ? 0.0f : static_cast<float>(s.weight_decay);
  return c;
}

namespace {

void narrow_block(std::span<const float> in, ckpt::DType narrow, uint16_t* out) {
  const std::span<uint16_t> bits(out, in.size());
  if (narrow == ckpt::DType::kBF16) ckpt::convert_fp32_to_bf16(in, bits);
  if (narrow == ckpt::DType::kF16) ckpt::convert_fp32_to_fp16(in, bits);
}

}  // namespace

void narrow_weights(std::span<const float> in, ckpt::DType narrow, uint16_t* out) {
  const int64_t n = static_cast<int64_t>(in.size());
#pragma omp parallel for schedule(static)
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    narrow_block(in.subspan(static_cast<size_t>(lo), static_cast<size_t>(std::min(kBlock, n - lo))), narrow, out + lo);
  }
}

namespace {

// Calls f(lo, len, decays) for the runs of elements [lo, lo + len) of the updated arrays that alike
// decay or do not, in order.
template <typename F>
void for_each_run(const NoDecayRanges& nd, int64_t lo, int64_t len, F&& f) {
  const ElementRange* const end = nd.ranges + nd.count;
  // The first range that ends after the block starts.
  const ElementRange* r =
      std::partition_point(nd.ranges, end, [&](const ElementRange& x) { return x.end <= nd.origin + lo; });
  int64_t at = lo;
  const int64_t hi = lo + len;
  while (at < hi) {
    if (r == end || r->begin - nd.origin >= hi) {
      f(at, hi - at, true);
      return;
    }
    const int64_t skip_lo = std::max(at, r->begin - nd.origin), skip_hi = std::min(hi, r->end - nd.origin);
    if (skip_lo > at) f(at, skip_lo - at, true);
    f(skip_lo, skip_hi - skip_lo, false);
    at = skip_hi;
    ++r;
  }
}

}  // namespace

void cpu_adamw(std::span<float> master, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<const float> grad, const AdamWCoefficients& c, NoDecayRanges no_decay, ckpt::DType narrow,
               uint16_t* narrowed) {
  const int64_t n = static_cast<int64_t>(master.size());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // Without weight decay every element takes the same update: no runs to find.
  if (!c.decays()) no_decay.count = 0;
  const AdamWCoefficients plain = c.without_decay();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, n - lo);
    for_each_run(no_decay, lo, len, [&](int64_t at, int64_t count, bool decays) {
      update_block(master.data() + at, exp_avg.data() + at, exp_avg_sq.data() + at, grad.data() + at, count,
                   decays ? c : plain);
    });
    if (narrow != ckpt::DType::kF32)
      narrow_block(master.subspan(static_cast<size_t>(lo), static_cast<size_t>(len)), narrow, narrowed + lo);
  }
}

}  // namespace shardkit::trainer
