// DeepSpeed's ZeRO partitioning: where each parameter's fp32 master weights and Adam moments lie in the
// optimizer-state files of each data-parallel rank. The reader (ds_checkpoint) and the writer
// (export_deepspeed) both use these functions; docs/DEEPSPEED.md describes the layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardkit::convert::deepspeed {

// Stage 1 and 2: one parameter group's parameters flattened in order into one buffer of `total`
// elements, padded with zeros to a multiple of 2 * W and split into W equal partitions.
struct Zero12Group {
  int64_t total = 0;
  int64_t partition = 0;         // P: elements per rank, padding included
  std::vector<int64_t> offsets;  // each parameter's first element in the flat buffer
  // Elements of rank r's partition that hold parameters (the saved fp32 partition leaves the padding out).
  int64_t valid(int64_t rank) const;
};
Zero12Group zero12_group(const std::vector<int64_t>& numels, int64_t world_size);

// Stage 3: every parameter split on its own into ceil(n / W) elements per rank (the last ranks' tails
// padded); a rank's flat buffer holds its piece of every parameter in order.
struct Zero3Layout {
  std::vector<int64_t> part;    // per parameter: elements per rank
  std::vector<int64_t> offset;  // per parameter: its piece's first element in every rank's buffer
  int64_t per_rank = 0;         // elements of every rank's buffer
  // Elements of parameter i that rank r's piece holds (the rest is padding).
  int64_t valid(size_t i, int64_t rank, int64_t numel) const;
};
Zero3Layout zero3_layout(const std::vector<int64_t>& numels, int64_t world_size);

// Stage 3's sub-groups of one parameter group (the unit of its optimizer step and of the files' fp32
// tensors): parameters are taken in order until the pieces they put on a rank reach `sub_group_size`
// elements; a group whose pieces add up to no more than that is one sub-group. Returns each sub-group's
// number of parameters.
std::vector<int64_t> zero3_sub_groups(const std::vector<int64_t>& parts, int64_t sub_group_size);

}  // namespace shardkit::convert::deepspeed
