#include "ckpt/synthetic.hpp"

#include <algorithm>

namespace shardkit::ckpt {
namespace {

// splitmix64's finaliser: a strong 64-bit mix, so neighbouring counters give unrelated values.
uint64_t mix(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

TensorTable synthetic_table(int64_t elements) {
  constexpr int64_t kWidth = 1024;
  constexpr int kBlocks = 8;
  const int64_t per_block = std::max<int64_t>(1, elements / kBlocks);
  std::vector<TensorInfo> tensors;
  tensors.push_back({"tiny", {3}, DType::kF32});
  for (int b = 0; b < kBlocks; ++b) {
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    const int64_t bias = kWidth + 3 * b + 1;  // odd sizes: boundaries fall anywhere
    const int64_t rows = std::max<int64_t>(1, (per_block - bias) / kWidth);
    tensors.push_back({prefix + "weight", {rows, kWidth}, DType::kF32});
    tensors.push_back({prefix + "bias", {bias}, DType::kF32});
  }
  tensors.push_back({"empty", {0, kWidth}, DType::kF32});
  return TensorTable(std::move(tensors));
}

float synthetic_value(uint64_t seed, int tensor, int state, int64_t element) noexcept {
  const uint64_t key = mix(seed ^ mix((uint64_t(uint32_t(tensor)) << 8) ^ uint64_t(uint32_t(state))));
  const uint64_t bits = mix(key + uint64_t(element));
  // 24 random bits -> [0, 1) exactly representable, then to [-1, 1).
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

void fill_synthetic(const Layout& layout, int rank, uint64_t seed, int state, std::span<float> flat) {
  std::fill(flat.begin(), flat.end(), 0.0f);
  for (const Fragment& f : layout.fragments(rank)) {
    float* out = flat.data() + f.flat_offset;
    for (int64_t i = 0; i < f.length; ++i) out[i] = synthetic_value(seed, f.tensor, state, f.tensor_offset + i);
  }
}

}  // namespace shardkit::ckpt
