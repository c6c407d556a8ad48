#include "convert/deepspeed/ds_layout.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace shardkit::convert::deepspeed {
namespace {

// Sums of element counts are bounded well below int64's range: the readers refuse declared sizes past
// 2^50 before they get here.
constexpr int64_t kMaxElements = int64_t{1} << 50;

void check_world(int64_t world_size) {
  if (world_size < 1 || world_size > (int64_t{1} << 20)) {
    fail(ErrorKind::kInternal, "a DeepSpeed world size of " + std::to_string(world_size));
  }
}

}  // namespace

int64_t Zero12Group::valid(int64_t rank) const {
  return std::clamp<int64_t>(total - rank * partition, 0, partition);
}

Zero12Group zero12_group(const std::vector<int64_t>& numels, int64_t world_size) {
  check_world(world_size);
  Zero12Group g;
  for (int64_t n : numels) {
    g.offsets.push_back(g.total);
    g.total += n;
    if (n < 0 || g.total > kMaxElements) fail(ErrorKind::kInvalidInput, "a parameter group past 2^50 elements");
  }
  // DeepSpeed aligns each partition's start for NCCL: the buffer is padded to a multiple of 2 * W.
  const int64_t align = 2 * world_size;
  g.partition = (g.total + align - 1) / align * align / world_size;
  return g;
}

int64_t Zero3Layout::valid(size_t i, int64_t rank, int64_t numel) const {
  return std::clamp<int64_t>(numel - rank * part[i], 0, part[i]);
}

Zero3Layout zero3_layout(const std::vector<int64_t>& numels, int64_t world_size) {
  check_world(world_size);
  Zero3Layout z;
  for (int64_t n : numels) {
    if (n < 0) fail(ErrorKind::kInvalidInput, "a parameter of negative size");
    z.offset.push_back(z.per_rank);
    z.part.push_back((n + world_size - 1) / world_size);
    z.per_rank += z.part.back();
    if (z.per_rank > kMaxElements) fail(ErrorKind::kInvalidInput, "parameters past 2^50 elements per rank");
  }
  return z;
}

std::vector<int64_t> zero3_sub_groups(const std::vector<int64_t>& parts, int64_t sub_group_size) {
  int64_t sum = 0;
  for (int64_t p : parts) sum += p;
  if (parts.empty() || sub_group_size >= sum) return {static_cast<int64_t>(parts.size())};
  std::vector<int64_t> counts;
  int64_t in_group = 0;
  int64_t elements = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ++in_group;
    elements += parts[i];
    if (elements >= sub_group_size || i + 1 == parts.size()) {
      counts.push_back(in_group);
      in_group = 0;
      elements = 0;
    }
  }
  return counts;
}

}  // namespace shardkit::convert::deepspeed
