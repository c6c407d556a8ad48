// The start order of the causal attention kernels' blocks (model/cuda/causal_order.hpp): every block
// exactly once, the plain order beyond the chunked grids' size, longest first within a chunk -- and what
// the order is for: on the grids that need it, greedy scheduling of the blocks onto the multiprocessors
// (each block to whichever frees up first, as the hardware does) ends close to the ideal.
#include "model/cuda/causal_order.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <utility>
#include <vector>

namespace shardkit::model::cuda {
namespace {

constexpr int kH100 = 132;  // multiprocessors of an H100 or H200

struct Grid {
  int blocks_per_row, rows, resident;
};

TEST(CausalOrder, StartsEveryBlockExactlyOnce) {
  for (const Grid g : {Grid{16, 16, kH100}, Grid{16, 32, kH100}, Grid{16, 7, 5}, Grid{3, 100, 10}, Grid{1, 1, 132},
                       Grid{64, 3, 132}, Grid{8, 192, kH100}, Grid{16, 128, kH100}}) {
    const CausalOrder order = CausalOrder::for_grid(g.blocks_per_row, g.rows, g.resident);
    std::set<std::pair<int, int>> seen;
    for (int i = 0; i < order.blocks(); ++i) {
      const CausalOrder::Block b = order.block(i);
      ASSERT_GE(b.row, 0);
      ASSERT_LT(b.row, g.rows);
      ASSERT_GE(b.rank, 0);
      ASSERT_LT(b.rank, g.blocks_per_row);
      ASSERT_TRUE(seen.emplace(b.row, b.rank).second) << "block " << i << " starts twice";
    }
    EXPECT_EQ(static_cast<int>(seen.size()), g.blocks_per_row * g.rows);
  }
}

TEST(CausalOrder, KeepsThePlainOrderBeyondTheChunkedGridsAndGoesLongestFirstWithin) {
  // GPT-2 at 16 x 1024 (12 heads, 8 blocks a row): 11.6 waves, the plain order, a row at a time.
  const CausalOrder plain = CausalOrder::for_grid(8, 16 * 12, kH100);
  EXPECT_EQ(plain.rows_per_chunk, 1);
  for (int i = 0; i < plain.blocks(); ++i) {
    EXPECT_EQ(plain.block(i).row, i / 8);
    EXPECT_EQ(plain.block(i).rank, i % 8);
  }
  // llama-2-7b at 1 x 2048 (32 heads, 16 blocks a row): 3.9 waves, chunks of 16 rows; within one, the
  // ranks never go back to a longer block, and a chunk's rows are consecutive.
  const CausalOrder chunked = CausalOrder::for_grid(16, 32, kH100);
  EXPECT_EQ(chunked.rows_per_chunk, 16);
  const int chunk_blocks = 16 * 16;
  for (int i = 1; i < chunked.blocks(); ++i) {
    if (i % chunk_blocks == 0) continue;
    EXPECT_GE(chunked.block(i).rank, chunked.block(i - 1).rank) << i;
    EXPECT_EQ(chunked.block(i).row / 16, chunked.block(i - 1).row / 16) << i;
  }
  // A last chunk of fewer rows is ordered the same way.
  const CausalOrder ragged = CausalOrder::for_grid(16, 7, 5);
  ASSERT_EQ(ragged.rows_per_chunk, 1);                       // 112 blocks > 8 waves of 5
  const CausalOrder small = CausalOrder::for_grid(4, 7, 5);  // 28 blocks, chunks of 2 rows
  ASSERT_EQ(small.rows_per_chunk, 2);
  EXPECT_EQ(small.block(24).row, 6);
  EXPECT_EQ(small.block(27).row, 6);
  EXPECT_EQ(small.block(27).rank, 3);
}

// The time the last multiprocessor finishes when `resident` of them take the blocks in start order,
// each the next block as soon as it is free; a block's work is its rank's distance from the shortest
// (blocks_per_row - rank tiles).
double makespan(const CausalOrder& order, int resident) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int m = 0; m < resident; ++m) free_at.push(0.0);
  double end = 0.0;
  for (int i = 0; i < order.blocks(); ++i) {
    const double start = free_at.top();
    free_at.pop();
    const double done = start + (order.blocks_per_row - order.block(i).rank);
    end = std::max(end, done);
    free_at.push(done);
  }
  return end;
}

double ideal(const CausalOrder& order, int resident) {
  const double work = 0.5 * order.blocks_per_row * (order.blocks_per_row + 1) * order.rows;
  return std::max(work / resident, static_cast<double>(order.blocks_per_row));
}

TEST(CausalOrder, ChunkedGridsEndWithinTenPercentOfTheIdeal) {
  // tinyllama-1.1b's dk/dv kernel at 4 x 2048 (4 kv heads, 16 blocks a row) and llama-2-7b's three
  // kernels at 1 x 2048 (32 heads): the plain order ends at 61 % and 77 % of the ideal.
  for (const Grid g : {Grid{16, 16, kH100}, Grid{16, 32, kH100}, Grid{32, 8, kH100}}) {
    const CausalOrder order = CausalOrder::for_grid(g.blocks_per_row, g.rows, g.resident);
    ASSERT_GT(order.rows_per_chunk, 1);
    const CausalOrder plain{g.blocks_per_row, g.rows, 1};
    const double best = ideal(order, g.resident);
    EXPECT_LE(makespan(order, g.resident), 1.1 * best) << g.blocks_per_row << " x " << g.rows;
    EXPECT_LT(makespan(order, g.resident), makespan(plain, g.resident)) << g.blocks_per_row << " x " << g.rows;
  }
}

}  // namespace
}  // namespace shardkit::model::cuda
