// Filling and copying large float arrays on the compute threads (OpenMP): gigabytes of optimizer states
// into a snapshot, fresh states set to zero. The first touch of fresh pages spreads over the threads
// that later compute on them.
#pragma once

#include <cstdint>

namespace shardkit {

// out[0, n) = value.
void parallel_fill(float* out, int64_t n, float value);

// out[0, n) = in[0, n); the ranges do not overlap.
void parallel_copy(float* out, const float* in, int64_t n);

}  // namespace shardkit
