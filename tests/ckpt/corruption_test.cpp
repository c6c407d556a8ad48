// Damaged checkpoints are detected, and the error names the file (and the tensor where data is hit).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using ckpt::CheckpointReader;
using testing::TempDir;

struct Fixture {
  TempDir dir;
  ckpt::TensorTable table{
      {{"emb", {64, 16}, ckpt::DType::kF32}, {"bias", {16}, ckpt::DType::kF32}, {"head", {40, 16}, ckpt::DType::kF32}}};
  std::filesystem::path step;
  std::filesystem::path shard1;

  explicit Fixture(int level = 0) {
    ckpt::ShardOptions options;
    options.chunk_elems = 128;
    options.compression_level = level;
    step = testing::write_synthetic_checkpoint(dir.path(), table, {2, 1, 16}, options, 1);
    shard1 = step / ckpt::shard_file_name(1, 2);
  }
};

std::string verify_problems(const std::filesystem::path& ckpt) {
  CheckpointReader reader(ckpt);
  const ckpt::VerifyReport report = reader.verify();
  std::string all;
  for (const auto& p : report.problems) all += p + "\n";
  return all;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Corruption, FlippedDataBitIsFoundAndNamed) {
  for (int level : {0, 3}) {
    Fixture f(level);
    // Shard 1 holds the end of emb, bias and head: chunk 2 of exp_avg holds head elements.
    const testing::ChunkExtent chunk = testing::chunk_extent(f.shard1, "exp_avg", 2);
    testing::flip_bit(f.shard1, chunk.offset + chunk.size / 2, 3);
    const std::string problems = verify_problems(f.step);
    EXPECT_TRUE(contains(problems, f.shard1.string())) << problems;
    EXPECT_TRUE(contains(problems, "exp_avg chunk 2")) << problems;
    if (level == 0) {
      EXPECT_TRUE(contains(problems, "tensor head[")) << problems;
    }
    // Reading the damaged range fails with the same precision, whether its chunks are read by one
    // thread or several; other states still read, and the same on both paths.
    for (const int threads : {1, 4}) {
      CheckpointReader reader(f.step, threads);
      std::vector<float> head(40 * 16);
      try {
        reader.read(2, reader.find_state("exp_avg"), 0, head);
        ADD_FAILURE() << "corrupt read succeeded (" << threads << " threads)";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
        EXPECT_TRUE(contains(e.what(), f.shard1.string())) << e.what();
      }
      EXPECT_NO_THROW(reader.read(2, reader.find_state("fp32"), 0, head));
      std::vector<float> emb(64 * 16), emb_sequential(64 * 16);
      reader.read(0, reader.find_state("fp32"), 3, std::span<float>(emb).subspan(3));
      CheckpointReader(f.step).read(0, reader.find_state("fp32"), 3, std::span<float>(emb_sequential).subspan(3));
      EXPECT_EQ(emb, emb_sequential);
    }
  }
}

TEST(Corruption, TruncatedShardIsFound) {
  Fixture f;
  const auto size = std::filesystem::file_size(f.shard1);
  std::filesystem::resize_file(f.shard1, size / 2);
  const std::string problems = verify_problems(f.step);
  EXPECT_TRUE(contains(problems, f.shard1.string())) << problems;
  EXPECT_TRUE(contains(problems, "truncated")) << problems;
}

TEST(Corruption, MissingShardIsFound) {
  Fixture f;
  std::filesystem::remove(f.shard1);
  const std::string problems = verify_problems(f.step);
  EXPECT_TRUE(contains(problems, f.shard1.string() + ": shard file is missing")) << problems;
  CheckpointReader reader(f.step);
  std::vector<float> emb(64 * 16);
  EXPECT_THROW(reader.read(0, 0, 0, emb), Error);  // emb straddles into rank 1
}

TEST(Corruption, BrokenManifestIsAnErrorNamingIt) {
  Fixture f;
  const auto manifest = f.step / "manifest.json";
  std::filesystem::resize_file(manifest, std::filesystem::file_size(manifest) / 2);
  try {
    CheckpointReader reader(f.step);
    FAIL() << "truncated manifest accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_TRUE(contains(e.what(), manifest.string())) << e.what();
  }
}

TEST(Corruption, ShardOfAnotherCheckpointIsRecognised) {
  Fixture a;
  Fixture b;  // same model and layout, another save
  std::filesystem::copy_file(b.shard1, a.shard1, std::filesystem::copy_options::overwrite_existing);
  const std::string problems = verify_problems(a.step);
  EXPECT_TRUE(contains(problems, a.shard1.string())) << problems;
  EXPECT_TRUE(contains(problems, "another checkpoint")) << problems;
}

TEST(Corruption, GarbageInPlaceOfAShardIsNotHdf5) {
  Fixture f;
  const auto size = std::filesystem::file_size(f.shard1);
  std::ofstream(f.shard1, std::ios::trunc) << std::string(size, 'x');
  const std::string problems = verify_problems(f.step);
  EXPECT_TRUE(contains(problems, f.shard1.string() + ": not an HDF5 file")) << problems;
}

TEST(Corruption, DamagedHdf5MetadataIsCaughtByItsChecksums) {
  Fixture f;
  testing::flip_bit(f.shard1, 20, 1);  // inside the superblock, which the 1.10 format checksums
  const std::string problems = verify_problems(f.step);
  EXPECT_TRUE(contains(problems, f.shard1.string())) << problems;
}

TEST(Corruption, LatestPointingNowhereIsAnError) {
  Fixture f;
  std::ofstream(f.dir / "latest", std::ios::trunc) << "step-00000099\n";
  EXPECT_THROW(CheckpointReader(f.dir.path()), Error);
  std::ofstream(f.dir / "latest", std::ios::trunc) << "../../etc\n";
  try {
    CheckpointReader reader(f.dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "latest")) << e.what();
  }
}

TEST(Corruption, NotACheckpointAtAll) {
  TempDir dir;
  try {
    CheckpointReader reader(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.what(), "not a shardkit checkpoint")) << e.what();
  }
  EXPECT_THROW(CheckpointReader(dir / "missing"), Error);
}

}  // namespace
}  // namespace shardkit
