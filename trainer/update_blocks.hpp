// The frame every CPU optimizer update shares (adamw.cpp, lion.cpp): the view in blocks on the calling
// thread's OpenMP team, each block cut into the runs of elements that take weight decay and that do not
// (the no-decay table), and the block's updated weights rounded to 16 bits in the same pass, while
// they are still in cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "ckpt/tensor_table.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer {

// Elements per unit of an update's work: large enough to amortise scheduling, small enough (4 arrays
// x 64 KiB) that the narrowing pass finds the block's weights still in cache.
inline constexpr int64_t kUpdateBlock = 16384;

// The bf16/fp16 bit patterns of a block of updated weights (fp32: nothing), on the calling thread.
void narrow_block(std::span<const float> in, ckpt::DType narrow, uint16_t* out);

// Calls f(lo, len, decays) for the runs of elements [lo, lo + len) of the updated arrays that alike
// decay or do not, in order.
template <typename F>
void for_each_decay_run(const NoDecayRanges& nd, int64_t lo, int64_t len, F&& f) {
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

// An update of `master` (and the states beside it) in blocks: update(at, count, decays) for every run
// of elements, then the block's weights narrowed into `narrowed` where `narrow` is 16-bit. `decays`:
// whether the update has any weight decay at all (else no runs are looked for).
template <typename Update>
void update_in_blocks(std::span<float> master, NoDecayRanges no_decay, bool decays, ckpt::DType narrow,
                      uint16_t* narrowed, Update&& update) {
  const int64_t n = static_cast<int64_t>(master.size());
  const int64_t blocks = (n + kUpdateBlock - 1) / kUpdateBlock;
  if (!decays) no_decay.count = 0;  // every element takes the same update
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kUpdateBlock, len = std::min(kUpdateBlock, n - lo);
    for_each_decay_run(no_decay, lo, len, update);
    if (narrow != ckpt::DType::kF32) {
      narrow_block(master.subspan(static_cast<size_t>(lo), static_cast<size_t>(len)), narrow, narrowed + lo);
    }
  }
}

}  // namespace shardkit::trainer
