#include "trainer/zero_plan.hpp"

#include <algorithm>
#include <string>

#include "base/error.hpp"

namespace shardkit::trainer {

ZeroPlan::ZeroPlan(const ckpt::TensorTable& table, int world_size, int rank, int stage)
    : layout_(table, {world_size, stage, ckpt::kDefaultAlignment}), rank_(rank) {
  if (rank < 0 || rank >= world_size) {
    fail(ErrorKind::kInternal,
         "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world_size) + " ranks");
  }
  numel_.reserve(table.size());
  for (const auto& t : table) numel_.push_back(t.numel());
}

int64_t ZeroPlan::replicated_size() const noexcept {
  return stage() == 3 ? 0 : world_size() * layout_.flat_size();
}

int64_t ZeroPlan::optimizer_size() const noexcept {
  return stage() == 0 ? replicated_size() : layout_.flat_size();
}

int64_t ZeroPlan::owned_offset() const noexcept {
  return stage() == 0 ? rank_ * layout_.flat_size() : 0;
}

std::vector<ckpt::Fragment> ZeroPlan::optimizer_fragments() const {
  if (stage() != 0) return layout_.fragments(rank_);
  std::vector<ckpt::Fragment> all;
  for (int t = 0; t < num_tensors(); ++t) {
    if (numel(t) > 0) all.push_back({t, 0, numel(t), layout_.global_offset(t)});
  }
  return all;
}

GlobalRun ZeroPlan::global_run(int first, int last) const {
  return {layout_.global_offset(first), layout_.global_offset(last - 1) + numel(last - 1)};
}

PartitionShare ZeroPlan::share(const GlobalRun& run, int rank) const noexcept {
  const int64_t begin = rank * layout_.flat_size(), end = begin + layout_.flat_size();
  const int64_t lo = std::max(run.lo, begin), hi = std::min(run.hi, end);
  if (lo >= hi) return {};
  return {lo - begin, hi - lo};
}

int64_t ZeroPlan::slot_end(int last) const {
  return last < num_tensors() ? layout_.slot_offset(last) : layout_.flat_size();
}

SlotRun ZeroPlan::slots(int first, int last) const {
  const int64_t base = layout_.slot_offset(first);
  return {first, last, base, slot_end(last) - base};
}

std::vector<SlotRun> ZeroPlan::buckets(int first, int last, int64_t max_elements) const {
  std::vector<SlotRun> out;
  for (int a = first; a < last;) {
    int b = a + 1;
    while (b < last && slot_end(b + 1) - layout_.slot_offset(a) <= max_elements) ++b;
    out.push_back(slots(a, b));
    a = b;
  }
  return out;
}

std::vector<PieceCopy> ZeroPlan::pieces(const SlotRun& run) const {
  std::vector<PieceCopy> out;
  for (int t = run.first; t < run.last; ++t) {
    const int64_t piece = layout_.piece_size(t);
    const int64_t in_block = layout_.slot_offset(t) - run.base;
    for (int r = 0; r < world_size(); ++r) {
      const int64_t count = layout_.piece_length(t, r);
      if (count > 0) out.push_back({t, r, r * piece, r * run.span + in_block, count});
    }
  }
  return out;
}

std::vector<ckpt::Fragment> fragments_within(std::span<const ckpt::Fragment> fragments, int64_t lo, int64_t hi) {
  std::vector<ckpt::Fragment> out;
  for (const ckpt::Fragment& f : fragments) {
    const int64_t a = std::max(lo, f.flat_offset), b = std::min(hi, f.flat_offset + f.length);
    if (a < b) out.push_back({f.tensor, f.tensor_offset + (a - f.flat_offset), b - a, a - lo});
  }
  return out;
}

int likely_next_group(int group, int previous, int count) noexcept {
  if (previous < 0) return -1;
  const int next = group + (group > previous ? 1 : -1);
  return next >= 0 && next < count ? next : -1;
}

std::vector<model::TensorGroup> consecutive_runs(std::span<const model::TensorGroup> groups,
                                                 std::span<const int> closed) {
  std::vector<model::TensorGroup> sorted;
  sorted.reserve(closed.size());
  for (int g : closed) sorted.push_back(groups[static_cast<size_t>(g)]);
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<model::TensorGroup> runs;
  for (const model::TensorGroup& g : sorted) {
    if (!runs.empty() && runs.back().last == g.first) {
      runs.back().last = g.last;
    } else {
      runs.push_back(g);
    }
  }
  return runs;
}

}  // namespace shardkit::trainer
