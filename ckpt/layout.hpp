// The layout function: the single place that knows how ZeRO partitions tensors across ranks.
//
// (tensor table, world size W, ZeRO stage, alignment A) -> for every rank, the fragments it owns:
// (tensor, offset in tensor, length, offset in the rank's flat buffer). The trainer, the shard writer,
// the reader and the converters all ask this class; none of them repeats the arithmetic.
//
//   Stages 0, 1, 2: every tensor concatenated in table order into one global flat buffer of N
//     elements; the buffer is padded to W * P elements with P = align_up(ceil(N / W), A), and rank r
//     owns the contiguous partition [r * P, (r + 1) * P). A tensor may straddle ranks; the padding sits
//     at the end of the last partitions. (Stage 0 replicates everything in memory; its checkpoint is
//     still written once, in this partitioning.)
//   Stage 3: every tensor partitioned on its own into pieces of p = ceil(n / W) elements; rank r owns
//     elements [r * p, min((r + 1) * p, n)). In each rank's flat buffer the pieces follow table order,
//     each at an offset aligned to A (slot size align_up(p, A)).
//
// Every rank's flat buffer has the same size, flat_size(), so collectives over partitions need no
// per-rank counts. Fragments are produced on demand in O(tensors) per rank, so world sizes in the
// tens of thousands cost no memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/tensor_table.hpp"

namespace shardkit::ckpt {

inline constexpr int64_t kDefaultAlignment = 16;  // elements: 64 bytes of fp32, a cache line
inline constexpr int kMaxWorldSize = 1 << 20;
inline constexpr int64_t kMaxAlignment = int64_t{1} << 20;

struct LayoutSpec {
  int world_size = 1;
  int stage = 0;  // ZeRO stage 0..3
  int64_t alignment = kDefaultAlignment;

  bool operator==(const LayoutSpec&) const = default;
};

// One contiguous run of a tensor's elements held by one rank.
struct Fragment {
  int32_t tensor = 0;         // index in the tensor table
  int64_t tensor_offset = 0;  // first element, in the tensor's flattened (row-major) order
  int64_t length = 0;         // elements, > 0
  int64_t flat_offset = 0;    // where the run starts in the owning rank's flat buffer

  bool operator==(const Fragment&) const = default;
};

// Where a run of a tensor's elements lives: the owning rank and the position in its flat buffer.
struct Placement {
  int rank = 0;
  int64_t flat_offset = 0;
  int64_t tensor_offset = 0;
  int64_t length = 0;
};

class Layout {
 public:
  // Validates the spec (1 <= W <= 2^20, stage 0..3, 1 <= A <= 2^20); throws Error(kInvalidInput).
  Layout(const TensorTable& table, const LayoutSpec& spec);

  const LayoutSpec& spec() const noexcept { return spec_; }
  int world_size() const noexcept { return spec_.world_size; }
  int stage() const noexcept { return spec_.stage; }
  size_t num_tensors() const noexcept { return numel_.size(); }

  // Elements in every rank's flat buffer, padding included.
  int64_t flat_size() const noexcept { return flat_size_; }

  // The fragments owned by `rank`, ordered by flat_offset (and therefore by tensor). Fragments never
  // overlap; in stages 0-2 they are back to back from offset 0.
  std::vector<Fragment> fragments(int rank) const;

  // Splits elements [offset, offset + length) of tensor `tensor` into the runs held by each rank, in
  // tensor order. Throws Error(kInvalidInput) when the range is outside the tensor.
  std::vector<Placement> locate(int tensor, int64_t offset, int64_t length) const;

  // Stages 0-2: the tensor's first element in the global flat buffer, and the partition size P.
  int64_t global_offset(int tensor) const;
  int64_t partition_size() const;
  // Stage 3: the piece size p = ceil(n / W) of a tensor, how many of its elements rank r holds (its
  // elements [r p, r p + piece_length) -- fewer than p, or none, at the end), and the offset of its
  // slot in every flat buffer.
  int64_t piece_size(int tensor) const;
  int64_t piece_length(int tensor, int rank) const;
  int64_t slot_offset(int tensor) const;

 private:
  void check_tensor(int tensor) const;

  LayoutSpec spec_;
  std::vector<int64_t> numel_;
  std::vector<int64_t> start_;  // stages 0-2: global offset; stage 3: slot offset in the flat buffer
  int64_t flat_size_ = 0;
};

// A 64-bit fingerprint of (tensor table, layout spec): shards carry it so that a shard of another
// checkpoint or model is recognised before any data is read.
uint64_t layout_fingerprint(const TensorTable& table, const LayoutSpec& spec);

}  // namespace shardkit::ckpt
