// Property tests of the ZeRO plan over random tensor tables, world sizes and stages: what it tells the
// engines must agree with the layout function element by element, since an engine that reduced a
// gradient into the wrong place would still train, only wrongly.
#include "trainer/zero_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit::trainer {
namespace {

// The optimizer view: every element the rank keeps states for exactly once, inside the view, and the
// checkpointed slice holds exactly the layout's fragments of the rank.
void check_optimizer_view(const ckpt::TensorTable& table, const ZeroPlan& plan) {
  const std::vector<ckpt::Fragment> fragments = plan.optimizer_fragments();
  int64_t end = 0;
  for (const ckpt::Fragment& f : fragments) {
    ASSERT_GE(f.flat_offset, end) << "by increasing position, not overlapping";
    end = f.flat_offset + f.length;
    ASSERT_LE(end, plan.optimizer_size());
  }
  ASSERT_LE(plan.owned_offset() + plan.owned_size(), plan.optimizer_size());
  if (plan.stage() == 0) {
    int64_t total = 0;
    for (const auto& t : table) total += t.numel();
    int64_t held = 0;
    for (const ckpt::Fragment& f : fragments) {
      EXPECT_EQ(f.tensor_offset, 0);
      EXPECT_EQ(f.length, table[static_cast<size_t>(f.tensor)].numel()) << "stage 0 keeps every tensor whole";
      held += f.length;
    }
    EXPECT_EQ(held, total);
  } else {
    EXPECT_EQ(fragments, plan.layout().fragments(plan.rank()));
  }
  // The checkpointed slice, seen from the layout: fragment positions relative to the slice.
  std::vector<ckpt::Fragment> in_slice;
  for (const ckpt::Fragment& f : fragments) {
    const int64_t lo = std::max(f.flat_offset, plan.owned_offset());
    const int64_t hi = std::min(f.flat_offset + f.length, plan.owned_offset() + plan.owned_size());
    if (lo < hi)
      in_slice.push_back({f.tensor, f.tensor_offset + (lo - f.flat_offset), hi - lo, lo - plan.owned_offset()});
  }
  // Adjacent runs of one tensor merge (stage 0's whole tensors are cut at partition borders).
  std::vector<ckpt::Fragment> merged;
  for (const ckpt::Fragment& f : in_slice) {
    if (!merged.empty() && merged.back().tensor == f.tensor &&
        merged.back().tensor_offset + merged.back().length == f.tensor_offset &&
        merged.back().flat_offset + merged.back().length == f.flat_offset) {
      merged.back().length += f.length;
    } else {
      merged.push_back(f);
    }
  }
  EXPECT_EQ(merged, plan.layout().fragments(plan.rank()));
}

// Stages 0-2: a reduce-scatter over any run of tensors hands every element to the rank the layout
// places it on, at the layout's position in that rank's partition.
void check_shares(const ZeroPlan& plan) {
  const int n = plan.num_tensors();
  for (int first = 0; first < n; ++first) {
    for (int last = first + 1; last <= n; last += 1 + (last - first) / 2) {
      const GlobalRun run = plan.global_run(first, last);
      ASSERT_LE(run.lo, run.hi);
      // Element position (global) -> (rank, offset in the partition), from the layout.
      std::map<int64_t, std::pair<int, int64_t>> placed;
      for (int t = first; t < last; ++t) {
        if (plan.numel(t) == 0) continue;
        for (const ckpt::Placement& p : plan.layout().locate(t, 0, plan.numel(t))) {
          placed[plan.layout().global_offset(t) + p.tensor_offset] = {p.rank, p.flat_offset};
        }
      }
      int64_t covered = 0;
      for (int r = 0; r < plan.world_size(); ++r) {
        const PartitionShare s = plan.share(run, r);
        ASSERT_GE(s.count, 0);
        if (s.count == 0) continue;
        ASSERT_GE(s.offset, 0);
        ASSERT_LE(s.offset + s.count, plan.partition_size());
        const int64_t global = plan.partition_offset(r) + s.offset;
        ASSERT_EQ(global, run.lo + covered) << "the shares tile the run in rank order";
        covered += s.count;
        // Every placement starting inside this share agrees with it.
        for (auto it = placed.lower_bound(global); it != placed.end() && it->first < global + s.count; ++it) {
          EXPECT_EQ(it->second.first, r);
          EXPECT_EQ(it->second.second, s.offset + (it->first - global));
        }
      }
      EXPECT_EQ(covered, run.hi - run.lo);
    }
  }
}

// Stage 3: the pieces of a slot run cover every tensor of it exactly once, each at the layout's slot
// position in its rank's block; buckets cut a range into maximal runs that fit.
void check_slots(const ZeroPlan& plan) {
  const int n = plan.num_tensors();
  const int w = plan.world_size();
  for (int first = 0; first < n; ++first) {
    for (int last = first + 1; last <= n; last += 1 + (last - first) / 2) {
      const SlotRun run = plan.slots(first, last);
      ASSERT_EQ(run.base, plan.layout().slot_offset(first));
      ASSERT_EQ(run.base + run.span, last < n ? plan.layout().slot_offset(last) : plan.layout().flat_size());
      std::vector<std::vector<int>> seen(static_cast<size_t>(n));
      for (int t = first; t < last; ++t) seen[static_cast<size_t>(t)].assign(static_cast<size_t>(plan.numel(t)), 0);
      std::vector<std::pair<int64_t, int64_t>> blocks;
      for (const PieceCopy& p : plan.pieces(run)) {
        ASSERT_GE(p.tensor, first);
        ASSERT_LT(p.tensor, last);
        ASSERT_GT(p.count, 0);
        ASSERT_LE(p.tensor_offset + p.count, plan.numel(p.tensor));
        for (int64_t i = 0; i < p.count; ++i)
          ++seen[static_cast<size_t>(p.tensor)][static_cast<size_t>(p.tensor_offset + i)];
        // The layout puts these elements on rank p.rank at its slot: block p.rank, same place.
        const std::vector<ckpt::Placement> at = plan.layout().locate(p.tensor, p.tensor_offset, p.count);
        ASSERT_EQ(at.size(), 1u);
        EXPECT_EQ(at[0].rank, p.rank);
        EXPECT_EQ(p.block_offset, p.rank * run.span + (at[0].flat_offset - run.base));
        ASSERT_LE(p.block_offset + p.count, (p.rank + 1) * run.span) << "inside its rank's block";
        blocks.emplace_back(p.block_offset, p.count);
      }
      for (int t = first; t < last; ++t) {
        for (const int c : seen[static_cast<size_t>(t)]) ASSERT_EQ(c, 1) << "tensor " << t;
      }
      std::ranges::sort(blocks);
      for (size_t i = 1; i < blocks.size(); ++i) ASSERT_GE(blocks[i].first, blocks[i - 1].first + blocks[i - 1].second);
      ASSERT_LE(blocks.empty() ? 0 : blocks.back().first + blocks.back().second, w * run.span);
    }
  }
  for (const int64_t max : {int64_t{1}, int64_t{64}, int64_t{1000}, int64_t{1} << 40}) {
    const std::vector<SlotRun> buckets = plan.buckets(0, n, max);
    int next = 0;
    for (size_t k = 0; k < buckets.size(); ++k) {
      const SlotRun& b = buckets[k];
      ASSERT_EQ(b.first, next) << "consecutive";
      ASSERT_GT(b.last, b.first) << "at least one tensor";
      EXPECT_TRUE(b.span <= max || b.last == b.first + 1) << "fits, or is one tensor";
      if (k + 1 < buckets.size()) {
        EXPECT_GT(plan.slots(b.first, b.last + 1).span, max) << "maximal";
      }
      next = b.last;
    }
    EXPECT_EQ(next, n);
  }
}

TEST(ZeroPlan, AgreesWithTheLayoutAtEveryStageRankAndWorldSize) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const ckpt::TensorTable table = testing::random_table(seed, 2 + static_cast<int>(seed % 4) * 3, 200);
    for (const int w : {1, 2, 3, 5, 8}) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (int rank = 0; rank < w; ++rank) {
          SCOPED_TRACE("seed " + std::to_string(seed) + " W=" + std::to_string(w) + " stage " + std::to_string(stage) +
                       " rank " + std::to_string(rank));
          const ZeroPlan plan(table, w, rank, stage);
          check_optimizer_view(table, plan);
          if (stage < 3) {
            EXPECT_EQ(plan.replicated_size(), w * plan.partition_size());
            if (rank == 0) check_shares(plan);
          } else {
            EXPECT_EQ(plan.replicated_size(), 0);
            if (rank == 0) check_slots(plan);
          }
        }
      }
    }
  }
}

// ZeRO's definition: stage 1 partitions the optimizer states, 2 also the gradients, 3 also the
// parameters; stages 1-2 gather the updated partitions of the replicated parameters.
TEST(ZeroPlan, EachStagePartitionsWhatZeroSays) {
  const ckpt::TensorTable table = testing::random_table(5, 4, 50);
  struct Expected {
    bool optimizer, grads, params, gathers;
  };
  const Expected expected[] = {
      {false, false, false, false}, {true, false, false, true}, {true, true, false, true}, {true, true, true, false}};
  for (int stage = 0; stage <= 3; ++stage) {
    const ZeroPlan plan(table, 2, 1, stage);
    const Expected& e = expected[stage];
    EXPECT_EQ(plan.partitions_optimizer(), e.optimizer) << stage;
    EXPECT_EQ(plan.partitions_grads(), e.grads) << stage;
    EXPECT_EQ(plan.partitions_params(), e.params) << stage;
    EXPECT_EQ(plan.gathers_updated_params(), e.gathers) << stage;
  }
}

TEST(ZeroPlan, ARankOutsideTheWorldIsRefused) {
  const ckpt::TensorTable table = testing::random_table(3, 4, 50);
  EXPECT_THROW(ZeroPlan(table, 2, 2, 1), Error);
  EXPECT_THROW(ZeroPlan(table, 2, -1, 1), Error);
}

// The engines' guess of the group gathered next: on in the direction of the last move, none at either
// end of the model or before a first move.
TEST(ZeroPlan, TheLikelyNextGroupFollowsTheWalk) {
  EXPECT_EQ(likely_next_group(0, -1, 5), -1);  // nothing gathered before: no direction yet
  EXPECT_EQ(likely_next_group(2, 1, 5), 3);    // the forward pass
  EXPECT_EQ(likely_next_group(4, 3, 5), -1);   // past the last group
  EXPECT_EQ(likely_next_group(4, 4, 5), 3);    // the backward pass starts where the forward ended
  EXPECT_EQ(likely_next_group(2, 3, 5), 1);
  EXPECT_EQ(likely_next_group(0, 1, 5), -1);  // past the first group
}

// A bucket's groups, closed in the backward pass's order, reduce as runs of consecutive tensors: a gap
// (a group still open) splits them, and a run covers exactly its groups' tensors.
TEST(ZeroPlan, ClosedGroupsReduceAsConsecutiveRuns) {
  const std::vector<model::TensorGroup> groups = {{0, 2}, {2, 5}, {5, 6}, {6, 9}, {9, 10}};
  auto runs = [&](std::vector<int> closed) {
    std::vector<std::pair<int, int>> out;
    for (const model::TensorGroup& r : consecutive_runs(groups, closed)) out.emplace_back(r.first, r.last);
    return out;
  };
  using Runs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(runs({4, 3, 2}), (Runs{{5, 10}}));
  EXPECT_EQ(runs({4, 2, 1}), (Runs{{2, 6}, {9, 10}}));
  EXPECT_EQ(runs({0}), (Runs{{0, 2}}));
  EXPECT_EQ(runs({3, 0, 4, 1}), (Runs{{0, 5}, {6, 10}}));
  EXPECT_TRUE(runs({}).empty());
}

}  // namespace
}  // namespace shardkit::trainer
