// The order in which the blocks of a causal attention kernel start. A block owns a run of rows of one
// (batch, head) and its work grows with its distance from the start of the sequence: the query block
// at the end reads every key tile, the first reads one (the key blocks of the dk/dv kernel the other
// way round). Blocks start in index order, each on whichever multiprocessor frees up first. In the
// plain order -- one (batch, head) after another, each from its longest block to its shortest -- a grid
// of a few waves ends with long blocks that started late while the other multiprocessors idle. Longest
// first across rows (list scheduling's rule) ends nearly balanced; it is applied within chunks of
// about kChunkWaves waves of consecutive rows, so that the blocks running at once read the keys and
// values of few heads, which stay in L2. Grids of more than kChunkedWaves waves keep the plain order:
// their tails are a small part of their time, and they lost more to the spread reads than they won.
// Plain C++ so that the host tests walk the same arithmetic the kernels do.
#pragma once

#include <algorithm>
#include <cstdint>

#include "base/host_device.hpp"

namespace shardkit::model::cuda {

struct CausalOrder {
  static constexpr int kChunkWaves = 2;
  static constexpr int kChunkedWaves = 8;

  int blocks_per_row = 1;  // the blocks of one (batch, head)
  int rows = 1;            // the (batch, head) pairs
  int rows_per_chunk = 1;  // 1 is the plain order

  // The order for a grid of blocks_per_row x rows blocks of which `resident` run at once (a wave).
  static CausalOrder for_grid(int blocks_per_row, int rows, int resident) {
    CausalOrder order{blocks_per_row, rows, 1};
    if (int64_t{blocks_per_row} * rows <= int64_t{kChunkedWaves} * resident) {
      order.rows_per_chunk = std::clamp(kChunkWaves * resident / blocks_per_row, 1, rows);
    }
    return order;
  }

  int blocks() const { return blocks_per_row * rows; }

  struct Block {
    int row;   // the (batch, head) pair
    int rank;  // 0 for the row's longest block, blocks_per_row - 1 for its shortest
  };
  // The block that starts `index`-th (blockIdx.x of a one-dimensional grid of blocks() blocks).
  SHARDKIT_HOST_DEVICE Block block(int index) const {
    const int chunk_blocks = rows_per_chunk * blocks_per_row;
    const int chunk = index / chunk_blocks, first_row = chunk * rows_per_chunk;
    const int in_chunk = index - chunk * chunk_blocks;
    const int chunk_rows = rows - first_row < rows_per_chunk ? rows - first_row : rows_per_chunk;
    return {first_row + in_chunk % chunk_rows, in_chunk / chunk_rows};
  }
};

}  // namespace shardkit::model::cuda
