#include "ckpt/layout.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "base/xxh64.hpp"

namespace shardkit::ckpt {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t align_up(int64_t x, int64_t a) {
  return ceil_div(x, a) * a;
}

}  // namespace

Layout::Layout(const TensorTable& table, const LayoutSpec& spec) : spec_(spec) {
  if (spec.world_size < 1 || spec.world_size > kMaxWorldSize) {
    fail(ErrorKind::kInvalidInput, "world size " + std::to_string(spec.world_size) + " is out of range (1.." +
                                       std::to_string(kMaxWorldSize) + ")");
  }
  if (spec.stage < 0 || spec.stage > 3) {
    fail(ErrorKind::kInvalidInput, "ZeRO stage " + std::to_string(spec.stage) + " does not exist (expected 0-3)");
  }
  if (spec.alignment < 1 || spec.alignment > kMaxAlignment) {
    fail(ErrorKind::kInvalidInput, "layout alignment " + std::to_string(spec.alignment) + " is out of range (1.." +
                                       std::to_string(kMaxAlignment) + ")");
  }
  const int64_t w = spec.world_size;
  numel_.reserve(table.size());
  start_.reserve(table.size());
  int64_t running = 0;
  for (const TensorInfo& t : table) {
    const int64_t n = t.numel();
    numel_.push_back(n);
    start_.push_back(running);
    running += spec.stage == 3 ? align_up(ceil_div(n, w), spec.alignment) : n;
  }
  flat_size_ = spec.stage == 3 ? running : align_up(ceil_div(running, w), spec.alignment);
}

void Layout::check_tensor(int tensor) const {
  if (tensor < 0 || static_cast<size_t>(tensor) >= numel_.size()) {
    fail(ErrorKind::kInvalidInput, "tensor index " + std::to_string(tensor) + " is outside the tensor table (" +
                                       std::to_string(numel_.size()) + " tensors)");
  }
}

int64_t Layout::global_offset(int tensor) const {
  check_tensor(tensor);
  if (spec_.stage == 3) fail(ErrorKind::kInternal, "global_offset() is defined for ZeRO stages 0-2 only");
  return start_[static_cast<size_t>(tensor)];
}

int64_t Layout::partition_size() const {
  if (spec_.stage == 3) fail(ErrorKind::kInternal, "partition_size() is defined for ZeRO stages 0-2 only");
  return flat_size_;
}

int64_t Layout::piece_size(int tensor) const {
  check_tensor(tensor);
  if (spec_.stage != 3) fail(ErrorKind::kInternal, "piece_size() is defined for ZeRO stage 3 only");
  return ceil_div(numel_[static_cast<size_t>(tensor)], spec_.world_size);
}

int64_t Layout::piece_length(int tensor, int rank) const {
  const int64_t piece = piece_size(tensor);
  return std::clamp<int64_t>(numel_[static_cast<size_t>(tensor)] - int64_t{rank} * piece, 0, piece);
}

int64_t Layout::slot_offset(int tensor) const {
  check_tensor(tensor);
  if (spec_.stage != 3) fail(ErrorKind::kInternal, "slot_offset() is defined for ZeRO stage 3 only");
  return start_[static_cast<size_t>(tensor)];
}

std::vector<Fragment> Layout::fragments(int rank) const {
  if (rank < 0 || rank >= spec_.world_size) {
    fail(ErrorKind::kInvalidInput,
         "rank " + std::to_string(rank) + " is outside world size " + std::to_string(spec_.world_size));
  }
  std::vector<Fragment> out;
  const size_t count = numel_.size();
  if (spec_.stage == 3) {
    for (size_t t = 0; t < count; ++t) {
      const int64_t p = ceil_div(numel_[t], spec_.world_size);
      const int64_t begin = rank * p;
      const int64_t end = std::min(begin + p, numel_[t]);
      if (end > begin) out.push_back({static_cast<int32_t>(t), begin, end - begin, start_[t]});
    }
    return out;
  }
  const int64_t lo = rank * flat_size_;
  const int64_t hi = lo + flat_size_;
  // First tensor that ends beyond lo (tensor ends are non-decreasing in table order).
  size_t first = 0;
  for (size_t upper = count; first < upper;) {
    const size_t mid = first + (upper - first) / 2;
    if (start_[mid] + numel_[mid] <= lo) {
      first = mid + 1;
    } else {
      upper = mid;
    }
  }
  for (size_t t = first; t < count && start_[t] < hi; ++t) {
    const int64_t begin = std::max(start_[t], lo);
    const int64_t end = std::min(start_[t] + numel_[t], hi);
    if (end > begin) out.push_back({static_cast<int32_t>(t), begin - start_[t], end - begin, begin - lo});
  }
  return out;
}

std::vector<Placement> Layout::locate(int tensor, int64_t offset, int64_t length) const {
  check_tensor(tensor);
  const int64_t n = numel_[static_cast<size_t>(tensor)];
  if (offset < 0 || length < 0 || offset > n || length > n - offset) {
    fail(ErrorKind::kInvalidInput, "range [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                                       ") is outside tensor " + std::to_string(tensor) + " of " + std::to_string(n) +
                                       " elements");
  }
  std::vector<Placement> out;
  const int64_t start = start_[static_cast<size_t>(tensor)];
  // Both stage families cut a linear position space into equal blocks owned by consecutive ranks:
  // stages 0-2 the global flat buffer in blocks of P, stage 3 the tensor itself in pieces of p.
  const bool per_tensor = spec_.stage == 3;
  const int64_t block = per_tensor ? ceil_div(n, spec_.world_size) : flat_size_;
  const int64_t base = per_tensor ? 0 : start;
  int64_t pos = offset;
  while (pos < offset + length) {
    const int64_t linear = base + pos;
    const int rank = static_cast<int>(linear / block);
    const int64_t within = linear % block;
    const int64_t run = std::min(block - within, offset + length - pos);
    out.push_back({rank, per_tensor ? start + within : within, pos, run});
    pos += run;
  }
  return out;
}

uint64_t layout_fingerprint(const TensorTable& table, const LayoutSpec& spec) {
  Xxh64 h;
  auto put = [&](int64_t v) { h.update(&v, sizeof(v)); };
  put(spec.world_size);
  put(spec.stage);
  put(spec.alignment);
  put(static_cast<int64_t>(table.size()));
  for (const TensorInfo& t : table) {
    put(static_cast<int64_t>(t.name.size()));
    h.update(t.name.data(), t.name.size());
    put(static_cast<int64_t>(t.shape.size()));
    for (int64_t d : t.shape) put(d);
    put(static_cast<int64_t>(t.dtype));
  }
  return h.digest();
}

}  // namespace shardkit::ckpt
