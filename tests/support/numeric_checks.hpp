// What the CPU kernels' tests against a double-precision evaluation share: normally distributed
// inputs from a seed, and one error measure for tensors of any scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace shardkit::testing {

// n values from N(0, spread^2), the same for the same seed.
inline std::vector<float> normal_values(size_t n, float spread, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

// Largest |a - b| over the largest |b|.
inline double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return err / std::max(ref, 1e-30);
}

}  // namespace shardkit::testing
