// Property tests of the layout function over random tensor tables, world sizes 1..64, all stages
// and several alignments.
#include "ckpt/layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "base/error.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit::ckpt {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Checks every property the trainer, writer, reader and converters rely on.
void check_layout(const TensorTable& table, const LayoutSpec& spec) {
  SCOPED_TRACE("W=" + std::to_string(spec.world_size) + " stage=" + std::to_string(spec.stage) +
               " alignment=" + std::to_string(spec.alignment) + " tensors=" + std::to_string(table.size()));
  const Layout layout(table, spec);
  const int w = spec.world_size;
  const int64_t flat = layout.flat_size();
  ASSERT_EQ(flat % spec.alignment, 0);

  // Ownership count per element: every element owned exactly once.
  std::vector<std::vector<int>> owners(table.size());
  for (size_t t = 0; t < table.size(); ++t) owners[t].assign(static_cast<size_t>(table[t].numel()), 0);
  std::vector<int64_t> owned(static_cast<size_t>(w), 0);
  for (int r = 0; r < w; ++r) {
    const std::vector<Fragment> fragments = layout.fragments(r);
    int64_t previous_end = 0;
    for (size_t i = 0; i < fragments.size(); ++i) {
      const Fragment& f = fragments[i];
      ASSERT_GT(f.length, 0);
      ASSERT_GE(f.tensor, 0);
      ASSERT_LT(static_cast<size_t>(f.tensor), table.size());
      ASSERT_GE(f.tensor_offset, 0);
      ASSERT_LE(f.tensor_offset + f.length, table[static_cast<size_t>(f.tensor)].numel());
      // Ordered by flat offset, non-overlapping, inside the flat buffer.
      ASSERT_GE(f.flat_offset, previous_end);
      ASSERT_LE(f.flat_offset + f.length, flat);
      if (spec.stage < 3) {
        ASSERT_EQ(f.flat_offset, previous_end) << "stage 0-2 fragments are back to back";
      } else {
        ASSERT_EQ(f.flat_offset % spec.alignment, 0) << "stage 3 slots are aligned";
        ASSERT_EQ(f.flat_offset, layout.slot_offset(f.tensor));
      }
      if (i > 0) {
        ASSERT_LT(fragments[i - 1].tensor, f.tensor) << "one fragment per tensor and rank, in table order";
      }
      previous_end = f.flat_offset + f.length;
      for (int64_t k = 0; k < f.length; ++k)
        ++owners[static_cast<size_t>(f.tensor)][static_cast<size_t>(f.tensor_offset + k)];
      owned[static_cast<size_t>(r)] += f.length;
    }
  }
  int64_t total = 0;
  for (size_t t = 0; t < table.size(); ++t) {
    for (size_t k = 0; k < owners[t].size(); ++k) ASSERT_EQ(owners[t][k], 1) << table[t].name << "[" << k << "]";
    total += table[t].numel();
  }

  // Balance: stages 0-2 fill ranks in order, every partition full except where the data ends;
  // stage 3 gives every rank at most one piece of ceil(n/W) per tensor, pieces in rank order.
  if (spec.stage < 3) {
    ASSERT_EQ(flat, ((ceil_div(total, w) + spec.alignment - 1) / spec.alignment) * spec.alignment);
    for (int r = 0; r < w; ++r) {
      const int64_t expected = std::clamp<int64_t>(total - r * flat, 0, flat);
      ASSERT_EQ(owned[static_cast<size_t>(r)], expected) << "rank " << r;
    }
  } else {
    for (size_t t = 0; t < table.size(); ++t) {
      const int64_t n = table[t].numel();
      const int64_t p = ceil_div(n, w);
      if (n == 0) continue;
      ASSERT_EQ(layout.piece_size(static_cast<int>(t)), p);
      for (int r = 0; r < w; ++r) {
        const int64_t expected = std::clamp<int64_t>(n - r * p, 0, p);
        int64_t got = 0;
        for (const Placement& pl : layout.locate(static_cast<int>(t), 0, n)) {
          if (pl.rank == r) got += pl.length;
        }
        ASSERT_EQ(got, expected) << table[t].name << " rank " << r;
      }
    }
  }
  const int64_t max_owned = *std::max_element(owned.begin(), owned.end());
  const int64_t min_owned = *std::min_element(owned.begin(), owned.end());
  ASSERT_LE(max_owned - min_owned, w * flat - total) << "imbalance beyond the padding";

  // locate() agrees with fragments() on every element, for random sub-ranges too.
  std::mt19937_64 rng(static_cast<uint64_t>(w * 131 + spec.stage));
  for (size_t t = 0; t < table.size(); ++t) {
    const int64_t n = table[t].numel();
    const int64_t a = n == 0 ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
    const int64_t b = a + (n == a ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(n - a + 1)));
    int64_t pos = a;
    for (const Placement& pl : layout.locate(static_cast<int>(t), a, b - a)) {
      ASSERT_EQ(pl.tensor_offset, pos);
      ASSERT_GT(pl.length, 0);
      bool found = false;
      for (const Fragment& f : layout.fragments(pl.rank)) {
        if (f.tensor == static_cast<int32_t>(t) && f.tensor_offset <= pos &&
            pos + pl.length <= f.tensor_offset + f.length) {
          ASSERT_EQ(pl.flat_offset, f.flat_offset + (pos - f.tensor_offset));
          found = true;
        }
      }
      ASSERT_TRUE(found) << "placement outside the owner's fragments";
      pos += pl.length;
    }
    ASSERT_EQ(pos, b);
  }
}

TEST(Layout, PropertiesHoldForRandomTablesWorldSizesAndStages) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const TensorTable table = testing::random_table(seed, 1 + static_cast<int>(seed % 9) * 3, 300);
    for (int w = 1; w <= 64; w += (w < 9 ? 1 : 7)) {
      for (int stage = 0; stage <= 3; ++stage) {
        for (int64_t alignment : {int64_t{1}, int64_t{2}, int64_t{16}}) {
          check_layout(table, {w, stage, alignment});
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(Layout, WorldSizeOf64IsCoveredExactly) {
  const TensorTable table = testing::random_table(99, 20, 500);
  for (int stage = 0; stage <= 3; ++stage) check_layout(table, {64, stage, 16});
}

TEST(Layout, MatchesDeepSpeedStage12Example) {
  // DeepSpeed's worked example: one group of 10 elements, W = 4, alignment 2 -> partitions of 4; owned 4, 4, 2, 0.
  const TensorTable table({{"w", {10}, DType::kF32}});
  const Layout layout(table, {4, 2, 2});
  EXPECT_EQ(layout.partition_size(), 4);
  EXPECT_EQ(layout.fragments(2), (std::vector<Fragment>{{0, 8, 2, 0}}));
  EXPECT_TRUE(layout.fragments(3).empty());
}

TEST(Layout, Stage3SplitsEachTensorIntoCeilPieces) {
  const TensorTable table({{"a", {5}, DType::kF32}, {"b", {2, 3}, DType::kF32}, {"c", {}, DType::kF32}});
  const Layout layout(table, {4, 3, 4});
  // a: pieces of 2 -> ranks 0,1,2 hold 2,2,1; b: pieces of 2 -> 2,2,2,0; c (scalar): rank 0 only.
  EXPECT_EQ(layout.piece_size(0), 2);
  EXPECT_EQ(layout.slot_offset(1), 4);
  EXPECT_EQ(layout.slot_offset(2), 8);
  EXPECT_EQ(layout.flat_size(), 12);
  EXPECT_EQ(layout.fragments(2), (std::vector<Fragment>{{0, 4, 1, 0}, {1, 4, 2, 4}}));
  EXPECT_EQ(layout.fragments(3), std::vector<Fragment>{});
  EXPECT_EQ(layout.fragments(0).back(), (Fragment{2, 0, 1, 8}));
  // What each rank holds of each tensor, as the fragments say.
  const int64_t a[4] = {2, 2, 1, 0}, b[4] = {2, 2, 2, 0}, c[4] = {1, 0, 0, 0};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(layout.piece_length(0, r), a[r]) << r;
    EXPECT_EQ(layout.piece_length(1, r), b[r]) << r;
    EXPECT_EQ(layout.piece_length(2, r), c[r]) << r;
  }
}

TEST(Layout, StraddlingTensorIsSplitAcrossRanks) {
  const TensorTable table({{"a", {3}, DType::kF32}, {"b", {10}, DType::kF32}});
  const Layout layout(table, {3, 1, 1});  // 13 elements -> partitions of 5
  const std::vector<Placement> pieces = layout.locate(1, 0, 10);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].rank, 0);
  EXPECT_EQ(pieces[0].flat_offset, 3);
  EXPECT_EQ(pieces[0].length, 2);
  EXPECT_EQ(pieces[1].rank, 1);
  EXPECT_EQ(pieces[1].flat_offset, 0);
  EXPECT_EQ(pieces[1].length, 5);
  EXPECT_EQ(pieces[2].rank, 2);
  EXPECT_EQ(pieces[2].length, 3);
}

TEST(Layout, EmptyTableAndEmptyTensors) {
  const TensorTable none;
  for (int stage = 0; stage <= 3; ++stage) {
    const Layout layout(none, {7, stage, 16});
    EXPECT_EQ(layout.flat_size(), 0);
    EXPECT_TRUE(layout.fragments(6).empty());
  }
  const TensorTable empties({{"e", {0}, DType::kF32}, {"f", {4, 0}, DType::kF32}});
  for (int stage = 0; stage <= 3; ++stage) {
    const Layout layout(empties, {3, stage, 16});
    EXPECT_TRUE(layout.locate(1, 0, 0).empty());
    EXPECT_TRUE(layout.fragments(0).empty());
  }
}

TEST(Layout, RejectsInvalidSpecsAndRanges) {
  const TensorTable table({{"a", {5}, DType::kF32}});
  EXPECT_THROW(Layout(table, {0, 1, 1}), Error);
  EXPECT_THROW(Layout(table, {2, 4, 1}), Error);
  EXPECT_THROW(Layout(table, {2, 1, 0}), Error);
  const Layout layout(table, {2, 1, 1});
  EXPECT_THROW(layout.locate(0, 3, 3), Error);
  EXPECT_THROW(layout.locate(1, 0, 1), Error);
  EXPECT_THROW(layout.fragments(2), Error);
}

TEST(Layout, FingerprintChangesWithEveryInput) {
  const TensorTable a({{"a", {5}, DType::kF32}});
  const TensorTable b({{"a", {6}, DType::kF32}});
  const TensorTable c({{"b", {5}, DType::kF32}});
  const uint64_t base = layout_fingerprint(a, {2, 1, 16});
  EXPECT_EQ(base, layout_fingerprint(a, {2, 1, 16}));
  EXPECT_NE(base, layout_fingerprint(b, {2, 1, 16}));
  EXPECT_NE(base, layout_fingerprint(c, {2, 1, 16}));
  EXPECT_NE(base, layout_fingerprint(a, {3, 1, 16}));
  EXPECT_NE(base, layout_fingerprint(a, {2, 2, 16}));
  EXPECT_NE(base, layout_fingerprint(a, {2, 1, 8}));
}

}  // namespace
}  // namespace shardkit::ckpt
