// Write/read round trips through the shard writer, the manifest and the checkpoint reader, with
// random tables, every stage, several world sizes, compressed and not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/synthetic.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using ckpt::CheckpointReader;
using testing::TempDir;

constexpr uint64_t kSeed = 77;

// Reads every tensor and state whole and in random straddling pieces; compares to the generator.
void expect_synthetic_content(CheckpointReader& reader, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const ckpt::TensorTable& table = reader.tensors();
  for (size_t t = 0; t < table.size(); ++t) {
    const int64_t n = table[t].numel();
    for (int s = 0; s < 3; ++s) {
      std::vector<float> whole(static_cast<size_t>(n));
      reader.read(static_cast<int>(t), s, 0, whole);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(whole[static_cast<size_t>(i)], ckpt::synthetic_value(seed, static_cast<int>(t), s, i))
            << table[t].name << " state " << s << " element " << i;
      }
      for (int trial = 0; trial < 4 && n > 0; ++trial) {
        const int64_t a = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
        const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - a));
        std::vector<float> part(static_cast<size_t>(len));
        reader.read(static_cast<int>(t), s, a, part);
        for (int64_t i = 0; i < len; ++i) {
          ASSERT_EQ(part[static_cast<size_t>(i)], whole[static_cast<size_t>(a + i)]);
        }
      }
    }
  }
}

TEST(ShardRoundTrip, EveryStageAndWorldSizeReadsBackExactly) {
  const ckpt::TensorTable table = testing::random_table(5, 14, 900);
  for (int w : {1, 2, 3, 4, 7}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int level : {0, 1}) {
        SCOPED_TRACE("W=" + std::to_string(w) + " stage=" + std::to_string(stage) + " zstd=" + std::to_string(level));
        TempDir dir;
        ckpt::ShardOptions options;
        options.chunk_elems = 97;  // small, odd chunks: ranges cross chunk boundaries everywhere
        options.compression_level = level;
        options.threads = 2;
        testing::write_synthetic_checkpoint(dir.path(), table, {w, stage, 16}, options, kSeed);
        CheckpointReader reader(dir.path());
        EXPECT_EQ(reader.manifest().layout.world_size, w);
        expect_synthetic_content(reader, kSeed);
        EXPECT_TRUE(reader.verify().ok());
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A checkpoint written without durability (shards through the page cache, manifest and `latest`
// without fsync) is the same checkpoint.
TEST(ShardRoundTrip, WithoutDurabilityTheSameCheckpointReadsBack) {
  const ckpt::TensorTable table = testing::random_table(6, 1, 5000);
  for (int stage : {1, 3}) {
    for (int level : {0, 1}) {
      SCOPED_TRACE("stage=" + std::to_string(stage) + " zstd=" + std::to_string(level));
      TempDir dir;
      ckpt::ShardOptions options;
      options.chunk_elems = 1024;  // whole 4 KiB chunks, as direct I/O would take them
      options.compression_level = level;
      options.threads = 2;
      options.durable = false;
      const auto step_dir = testing::write_synthetic_checkpoint(dir.path(), table, {3, stage, 16}, options, kSeed);
      EXPECT_EQ(ckpt::read_latest(dir.path()), step_dir.filename().string());
      CheckpointReader reader(dir.path());
      expect_synthetic_content(reader, kSeed);
      EXPECT_TRUE(reader.verify().ok());
      for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
        EXPECT_NE(e.path().extension(), ".tmp") << e.path();
      }
      if (HasFatalFailure()) return;
    }
  }
}

// A resume reads all of a rank's ranges in one batch on several threads: many ranges share chunks
// (with each other and across states), straddle shards, and are empty or one element long.
TEST(ShardRoundTrip, ABatchOfRangesOnSeveralThreadsReadsExactly) {
  const ckpt::TensorTable table = testing::random_table(11, 20, 700);
  for (int stage : {1, 3}) {
    for (int level : {0, 1}) {
      SCOPED_TRACE("stage=" + std::to_string(stage) + " zstd=" + std::to_string(level));
      TempDir dir;
      ckpt::ShardOptions options;
      options.chunk_elems = 61;
      options.compression_level = level;
      testing::write_synthetic_checkpoint(dir.path(), table, {3, stage, 8}, options, kSeed);
      CheckpointReader reader(dir.path(), 4);
      std::mt19937_64 rng(kSeed + static_cast<uint64_t>(stage));
      struct Expected {
        int tensor, state;
        int64_t offset;
        std::vector<float> values;
      };
      std::vector<Expected> ranges;
      for (int i = 0; i < 300; ++i) {
        const int t = static_cast<int>(rng() % table.size());
        const int64_t n = table[static_cast<size_t>(t)].numel();
        const int64_t a = n > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(n)) : 0;
        const int64_t len = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - a + 1));
        ranges.push_back({t, static_cast<int>(rng() % 3), a, std::vector<float>(static_cast<size_t>(len), -1.0f)});
      }
      std::vector<ckpt::ReadRequest> requests;
      for (Expected& r : ranges) requests.push_back({r.tensor, r.state, r.offset, r.values});
      reader.read(requests);
      for (const Expected& r : ranges) {
        for (size_t i = 0; i < r.values.size(); ++i) {
          ASSERT_EQ(r.values[i], ckpt::synthetic_value(kSeed, r.tensor, r.state, r.offset + static_cast<int64_t>(i)))
              << table[static_cast<size_t>(r.tensor)].name << " state " << r.state << " element " << r.offset + i;
        }
      }
    }
  }
}

TEST(ShardRoundTrip, LargeChunksAndTheDefaultChunkSize) {
  const ckpt::TensorTable table = ckpt::synthetic_table(600'000);
  TempDir dir;
  testing::write_synthetic_checkpoint(dir.path(), table, {3, 2, 16}, {}, kSeed);
  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.manifest().chunk_elems, ckpt::kDefaultChunkElems);
  expect_synthetic_content(reader, kSeed);
}

TEST(ShardRoundTrip, DifferentLayoutsOfTheSameStateDiffAsIdentical) {
  const ckpt::TensorTable table = testing::random_table(11, 10, 2000);
  TempDir dir;
  const auto a = testing::write_synthetic_checkpoint(dir / "a", table, {2, 1, 16}, {}, kSeed);
  ckpt::ShardOptions compressed;
  compressed.compression_level = 3;
  compressed.chunk_elems = 1000;
  const auto b = testing::write_synthetic_checkpoint(dir / "b", table, {5, 3, 4}, compressed, kSeed);
  const auto c = testing::write_synthetic_checkpoint(dir / "c", table, {3, 0, 1}, {}, kSeed + 1);
  CheckpointReader ra(a), rb(b), rc(c);
  const ckpt::DiffReport same = ckpt::diff_checkpoints(ra, rb);
  EXPECT_TRUE(same.within(0.0));
  EXPECT_EQ(same.entries.size(), table.size() * 3);
  for (const auto& e : same.entries) EXPECT_EQ(e.differing, 0) << e.tensor;
  const ckpt::DiffReport other = ckpt::diff_checkpoints(ra, rc, {}, 333);
  EXPECT_FALSE(other.within(0.5));
  EXPECT_GT(other.max_abs_diff(), 0.5);
}

TEST(ShardRoundTrip, DiffReportsMissingAndReshapedTensors) {
  TempDir dir;
  const ckpt::TensorTable t1({{"a", {4}, ckpt::DType::kF32}, {"b", {3}, ckpt::DType::kF32}});
  const ckpt::TensorTable t2({{"a", {2, 2}, ckpt::DType::kF32}, {"c", {3}, ckpt::DType::kF32}});
  const auto a = testing::write_synthetic_checkpoint(dir / "a", t1, {1, 1, 16}, {}, kSeed);
  const auto b = testing::write_synthetic_checkpoint(dir / "b", t2, {1, 1, 16}, {}, kSeed);
  CheckpointReader ra(a), rb(b);
  const ckpt::DiffReport r = ckpt::diff_checkpoints(ra, rb);
  EXPECT_EQ(r.only_in_a, std::vector<std::string>{"b"});
  EXPECT_EQ(r.only_in_b, std::vector<std::string>{"c"});
  EXPECT_EQ(r.shape_mismatch, std::vector<std::string>{"a"});
  EXPECT_FALSE(r.within(1e9));
}

TEST(ShardRoundTrip, RunDirectoryFollowsLatestAndListsIncompleteSaves) {
  TempDir dir;
  const ckpt::TensorTable table = testing::random_table(3, 5, 100);
  testing::write_synthetic_checkpoint(dir.path(), table, {2, 1, 16}, {}, kSeed, 10);
  testing::write_synthetic_checkpoint(dir.path(), table, {2, 1, 16}, {}, kSeed, 20);
  std::filesystem::create_directories(dir / "step-00000030");  // a save that never committed
  EXPECT_EQ(ckpt::resolve_checkpoint(dir.path()), dir / "step-00000020");
  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.manifest().step, 20);
  const auto list = ckpt::list_checkpoints(dir.path());
  ASSERT_EQ(list.size(), 3u);
  EXPECT_TRUE(list[0].committed);
  EXPECT_FALSE(list[0].latest);
  EXPECT_TRUE(list[1].latest);
  EXPECT_FALSE(list[2].committed);
  EXPECT_NE(list[2].problem.find("no manifest"), std::string::npos);
  EXPECT_THROW(CheckpointReader(dir / "step-00000030"), Error);
}

// Pruning keeps the newest committed steps and the one `latest` names, and leaves an uncommitted one
// for the cleanup; a damaged step is set aside under a name no listing takes for a step.
TEST(ShardRoundTrip, PruningKeepsTheNewestAndLatestAndSettingAsideMovesOneStep) {
  TempDir dir;
  const ckpt::TensorTable table = testing::random_table(3, 5, 100);
  for (int64_t step : {10, 20, 30, 40})
    testing::write_synthetic_checkpoint(dir.path(), table, {1, 1, 16}, {}, kSeed, step);
  std::filesystem::create_directories(dir / "step-00000050");  // never committed
  std::ofstream(dir / "latest", std::ios::trunc) << "step-00000020";
  ckpt::prune_committed(dir.path(), 1);
  std::vector<std::string> left;
  for (const auto& c : ckpt::list_checkpoints(dir.path())) left.push_back(c.name);
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000020", "step-00000040", "step-00000050"}));
  EXPECT_NE(ckpt::set_aside_damaged(dir / "step-00000040").find("step-00000040.damaged"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_directory(dir / "step-00000040.damaged"));
  left.clear();
  for (const auto& c : ckpt::list_checkpoints(dir.path())) left.push_back(c.name);
  EXPECT_EQ(left, (std::vector<std::string>{"step-00000020", "step-00000050"}));
}

TEST(ShardRoundTrip, RefusesToOverwriteACommittedCheckpoint) {
  TempDir dir;
  const ckpt::TensorTable table = testing::random_table(3, 5, 100);
  testing::write_synthetic_checkpoint(dir.path(), table, {1, 1, 16}, {}, kSeed, 5);
  try {
    testing::write_synthetic_checkpoint(dir.path(), table, {1, 1, 16}, {}, kSeed, 5);
    FAIL() << "overwrote a committed checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("already holds a committed checkpoint"), std::string::npos);
  }
  CheckpointReader reader(dir.path());
  EXPECT_TRUE(reader.verify().ok());
}

TEST(ShardRoundTrip, WriterLeavesNoFileWhenNotCommitted) {
  TempDir dir;
  const ckpt::TensorTable table({{"a", {10}, ckpt::DType::kF32}});
  const ckpt::Layout layout(table, {1, 1, 1});
  {
    ckpt::ShardWriter writer(dir / "shard-00000-of-00001.h5", table, layout, {"uid", 1, 0}, {"fp32"}, {});
    std::vector<float> flat(static_cast<size_t>(layout.flat_size()), 1.0f);
    writer.write_state("fp32", flat);
    EXPECT_TRUE(std::filesystem::exists(dir / "shard-00000-of-00001.h5.tmp"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace shardkit

namespace shardkit {
namespace {

TEST(ShardRoundTrip, StreamedAppendsWriteTheSameShardAsOneCall) {
  const ckpt::TensorTable table = testing::random_table(17, 9, 3000);
  const ckpt::Layout layout(table, {3, 2, 16});
  std::vector<float> flat(static_cast<size_t>(layout.flat_size()));
  ckpt::fill_synthetic(layout, 1, kSeed, 0, flat);
  std::mt19937_64 rng(3);
  for (int level : {0, 2}) {
    TempDir dir;
    ckpt::ShardOptions options;
    options.chunk_elems = 101;
    options.compression_level = level;
    ckpt::ShardWriter whole(dir / "a.h5", table, layout, {"uid", 1, 1}, {"fp32"}, options);
    whole.write_state("fp32", flat);
    const ckpt::ShardRecord a = whole.commit();
    ckpt::ShardWriter streamed(dir / "b.h5", table, layout, {"uid", 1, 1}, {"fp32"}, options);
    streamed.begin_state("fp32");
    size_t pos = 0;
    while (pos < flat.size()) {
      const size_t n = std::min<size_t>(flat.size() - pos, rng() % 250);  // pieces of 0..249, across chunks
      streamed.append(std::span<const float>(flat).subspan(pos, n));
      pos += n;
    }
    streamed.end_state();
    const ckpt::ShardRecord b = streamed.commit();
    EXPECT_EQ(a.digest, b.digest) << "level " << level;
    EXPECT_EQ(a.bytes, b.bytes);
    // Appending past the end, or ending early, is refused.
    ckpt::ShardWriter bad(dir / "c.h5", table, layout, {"uid", 1, 1}, {"fp32"}, options);
    bad.begin_state("fp32");
    bad.append(std::span<const float>(flat).first(10));
    EXPECT_THROW(bad.end_state(), Error);
  }
}

}  // namespace
}  // namespace shardkit
