#include "base/parallel_memory.hpp"

namespace shardkit {

void parallel_fill(float* out, int64_t n, float value) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
}

void parallel_copy(float* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

}  // namespace shardkit
