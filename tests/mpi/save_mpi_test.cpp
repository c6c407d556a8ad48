// The save protocol on real MPI ranks: every rank writes its shard in parallel, rank 0 commits, and
// any rank (or another world size) reads back exactly what was saved. Run at 1-4 ranks.
#include <gtest/gtest.h>

#include <random>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/synthetic.hpp"
#include "comm/mpi.hpp"
#include "tests/support/mpi_support.hpp"

namespace shardkit {
namespace {

std::vector<std::vector<float>> synthetic_buffers(const ckpt::Layout& layout, int rank, uint64_t seed) {
  std::vector<std::vector<float>> buffers(3, std::vector<float>(static_cast<size_t>(layout.flat_size())));
  for (int s = 0; s < 3; ++s) ckpt::fill_synthetic(layout, rank, seed, s, buffers[static_cast<size_t>(s)]);
  return buffers;
}

ckpt::SaveResult save(comm::MpiCollective& world, const std::filesystem::path& dir, const ckpt::TensorTable& table,
                      int stage, int level, uint64_t seed, int64_t step) {
  const ckpt::Layout layout(table, {world.size(), stage, 16});
  const auto buffers = synthetic_buffers(layout, world.rank(), seed);
  ckpt::SaveRequest request;
  request.run_dir = dir;
  request.meta.step = step;
  request.meta.table = &table;
  request.meta.layout = layout.spec();
  request.meta.states = testing::adam_states();
  request.meta.shard.compression_level = level;
  request.meta.shard.chunk_elems = 113;
  request.meta.trainer_state = {{"step", step}, {"world", world.size()}};
  for (const auto& b : buffers) request.buffers.push_back(b);
  return ckpt::save_checkpoint(world, request);
}

TEST(SaveMpi, EveryRankWritesItsShardAndAnyRankReadsEverything) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  const ckpt::TensorTable table = testing::random_table(21, 12, 700);
  for (int stage = 0; stage <= 3; ++stage) {
    for (int level : {0, 3}) {
      testing::SharedDir dir(world);
      const ckpt::SaveResult result = save(world, dir.path(), table, stage, level, 99, 7);
      EXPECT_EQ(result.step_dir, dir.path() / "step-00000007");
      // Every rank reads the whole checkpoint, in pieces that straddle shards and chunks.
      ckpt::CheckpointReader reader(dir.path());
      EXPECT_EQ(reader.manifest().layout.world_size, world.size());
      EXPECT_EQ(reader.manifest().trainer_state["world"], world.size());
      EXPECT_EQ(reader.manifest().total_bytes(), result.bytes);
      std::mt19937_64 rng(static_cast<uint64_t>(world.rank() * 10 + stage));
      for (size_t t = 0; t < table.size(); ++t) {
        const int64_t n = table[t].numel();
        for (int s = 0; s < 3; ++s) {
          int64_t offset = 0;
          while (offset < n) {
            const int64_t len = std::min<int64_t>(n - offset, 1 + static_cast<int64_t>(rng() % 300));
            std::vector<float> part(static_cast<size_t>(len));
            reader.read(static_cast<int>(t), s, offset, part);
            for (int64_t i = 0; i < len; ++i) {
              ASSERT_EQ(part[static_cast<size_t>(i)], ckpt::synthetic_value(99, static_cast<int>(t), s, offset + i))
                  << table[t].name << " stage " << stage;
            }
            offset += len;
          }
        }
      }
      if (world.rank() == 0) {
        EXPECT_TRUE(reader.verify().ok());
      }
    }
  }
}

TEST(SaveMpi, LatestMovesOnlyWhenACheckpointCommits) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  const ckpt::TensorTable table = testing::random_table(4, 6, 300);
  testing::SharedDir dir(world);
  save(world, dir.path(), table, 2, 0, 1, 10);
  save(world, dir.path(), table, 2, 0, 2, 20);
  ckpt::CheckpointReader latest(dir.path());
  EXPECT_EQ(latest.manifest().step, 20);
  // A second save of step 20 is refused on every rank alike, and step 20 stays intact.
  try {
    save(world, dir.path(), table, 2, 0, 3, 20);
    ADD_FAILURE() << "re-save of a committed step succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("already holds a committed checkpoint"), std::string::npos);
  }
  ckpt::CheckpointReader again(dir.path());
  EXPECT_EQ(again.manifest().step, 20);
  std::vector<float> x(1);
  for (size_t t = 0; t < table.size(); ++t) {
    if (table[t].numel() == 0) continue;
    again.read(static_cast<int>(t), 0, 0, x);
    EXPECT_EQ(x[0], ckpt::synthetic_value(2, static_cast<int>(t), 0, 0));
  }
}

TEST(SaveMpi, AFailingRankFailsTheSaveOnEveryRankWithoutAHang) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  const ckpt::TensorTable table = testing::random_table(8, 6, 300);
  testing::SharedDir dir(world);
  // The last rank cannot create its shard: a directory stands where its file must go.
  const std::filesystem::path step_dir = dir.path() / "step-00000003";
  if (world.rank() == 0) {
    std::filesystem::create_directories(step_dir / (ckpt::shard_file_name(world.size() - 1, world.size()) + ".tmp") /
                                        "x");
  }
  world.barrier();
  try {
    save(world, dir.path(), table, 1, 0, 5, 3);
    ADD_FAILURE() << "save succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(world.size() - 1)), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(step_dir / "manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "latest"));
}

}  // namespace
}  // namespace shardkit
