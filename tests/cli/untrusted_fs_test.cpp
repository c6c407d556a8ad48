// Run folders and inputs crafted as an attacker would: symbolic links, FIFOs and hard links where
// shardkit writes or deletes, and outputs that overlap their input. Nothing outside the folders the
// user named is written or deleted, no input is replaced by its own output, and each refusal is one
// line that names the path.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/run_lock.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/cli/cli_support.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

constexpr char kPrecious[] = "precious: a file outside every folder shardkit was given\n";

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Whether a file written with kPrecious still holds exactly that (a failure does not print what was
// written over it: a whole shard file, say).
bool untouched(const std::filesystem::path& path) {
  return slurp(path) == kPrecious;
}

std::string train_args(const std::filesystem::path& data, const std::filesystem::path& run_dir, int steps = 1) {
  return "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data.string() + " --steps " +
         std::to_string(steps) + " --threads 1 --save-dir " + run_dir.string();
}

// A refusal: exit code 2, one line on stderr naming `name` and saying `says`.
void expect_refused(const Result& r, const std::string& name, const std::string& says) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
}

TEST(UntrustedFs, ALockFileThatIsNotAFileOfItsOwnIsRefusedAndNothingOutsideIsWritten) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  write(dir / "victim", kPrecious);

  std::filesystem::create_directories(dir / "linked");
  std::filesystem::create_symlink(dir / "victim", dir / "linked" / ckpt::kLockFileName);
  Result r = run(train_args(data, dir / "linked"));
  expect_refused(r, ".shardkit.lock", "a symbolic link");
  EXPECT_EQ(r.out.find("precious"), std::string::npos) << "the target's first line is not printed: " << r.out;

  std::filesystem::create_directories(dir / "hard");
  std::filesystem::create_hard_link(dir / "victim", dir / "hard" / ckpt::kLockFileName);
  r = run(train_args(data, dir / "hard"));
  expect_refused(r, ".shardkit.lock", "2 hard links");

  std::filesystem::create_directories(dir / "fifo");
  ASSERT_EQ(::mkfifo((dir / "fifo" / ckpt::kLockFileName).c_str(), 0600), 0);
  r = run(train_args(data, dir / "fifo"));
  expect_refused(r, ".shardkit.lock", "not a regular file");

  EXPECT_TRUE(untouched(dir / "victim"));
  for (const char* run_dir : {"linked", "hard", "fifo"}) {
    EXPECT_FALSE(std::filesystem::exists(dir / run_dir / "latest")) << run_dir << ": the refused job saved nothing";
  }
}

TEST(UntrustedFs, ACleanupFollowsNoSymlinkedStepDirectory) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  // What a killed save leaves, in a folder outside the run: its clean-up must not reach in there.
  std::filesystem::create_directories(dir / "outside");
  write(dir / "outside" / "manifest.json", "{}");
  write(dir / "outside" / "work.tmp", kPrecious);
  std::filesystem::create_directories(dir / "run");
  std::filesystem::create_directory_symlink(dir / "outside", dir / "run" / "step-00000005");

  const Result r = run(train_args(data, dir / "run", 2) + " --save-interval 1 --keep-last 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: left " + (dir / "run" / "step-00000005").string() + " alone: a symbolic link"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(untouched(dir / "outside" / "work.tmp"));
  EXPECT_EQ(slurp(dir / "outside" / "manifest.json"), "{}");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "run" / "step-00000005")) << "neither pruned nor set aside";
  EXPECT_EQ(ckpt::read_latest(dir / "run").value_or(""), "step-00000002");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "step-00000001")) << "--keep-last 1 pruned the run's own";
}

TEST(UntrustedFs, ASymlinkedLatestIsNotReadAndIsReplacedNotWrittenThrough) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  ASSERT_EQ(run(train_args(data, dir / "run")).code, 0);
  write(dir / "outside-latest", "step-00000001\n");
  std::filesystem::remove(dir / "run" / "latest");
  std::filesystem::create_symlink(dir / "outside-latest", dir / "run" / "latest");

  Result r = run("ckpt verify " + (dir / "run").string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("latest: a symbolic link, not followed"), std::string::npos) << r.err;

  // Nor is a step directory that `latest` names but is a link to a checkpoint elsewhere.
  std::filesystem::remove(dir / "run" / "latest");
  write(dir / "run" / "latest", "step-00000009\n");
  std::filesystem::create_directory_symlink(dir / "run" / "step-00000001", dir / "run" / "step-00000009");
  r = run("ckpt verify " + (dir / "run").string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("names step-00000009, a symbolic link"), std::string::npos) << r.err;
  std::filesystem::remove(dir / "run" / "step-00000009");
  std::filesystem::remove(dir / "run" / "latest");
  std::filesystem::create_symlink(dir / "outside-latest", dir / "run" / "latest");

  // A resumed run commits a new `latest` in place of the link.
  r = run(train_args(data, dir / "run", 2));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::is_symlink(dir / "run" / "latest"));
  EXPECT_EQ(ckpt::read_latest(dir / "run").value_or(""), "step-00000002");
  EXPECT_EQ(slurp(dir / "outside-latest"), "step-00000001\n");
}

TEST(UntrustedFs, TemporaryFilesLeftAsSymlinksAreReplacedNotWrittenThrough) {
  testing::TempDir dir;
  write(dir / "victim", kPrecious);
  std::filesystem::create_symlink(dir / "victim", dir / "latest.tmp");
  write_file_durable(dir / "latest", "step-00000002\n");
  EXPECT_TRUE(untouched(dir / "victim"));
  EXPECT_FALSE(std::filesystem::is_symlink(dir / "latest"));
  EXPECT_EQ(slurp(dir / "latest"), "step-00000002\n");

  // A shard's temporary file in a step directory a killed save left behind.
  const std::filesystem::path step_dir = dir / "run" / ckpt::step_dir_name(1);
  std::filesystem::create_directories(step_dir);
  std::filesystem::create_symlink(dir / "victim", step_dir / (ckpt::shard_file_name(0, 1) + ".tmp"));
  const ckpt::TensorTable table = testing::random_table(3, 4, 100);
  testing::write_synthetic_checkpoint(dir / "run", table, {1, 2, ckpt::kDefaultAlignment}, {}, 7);
  EXPECT_TRUE(untouched(dir / "victim"));
  EXPECT_EQ(ckpt::read_manifest(step_dir).shards.size(), 1u);
}

TEST(UntrustedFs, AStepDirectoryThatIsASymlinkIsNotSavedInto) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "outside");
  std::filesystem::create_directories(dir / "run");
  std::filesystem::create_directory_symlink(dir / "outside", dir / "run" / ckpt::step_dir_name(1));
  const ckpt::TensorTable table = testing::random_table(3, 4, 100);
  try {
    testing::write_synthetic_checkpoint(dir / "run", table, {1, 2, ckpt::kDefaultAlignment}, {}, 7);
    ADD_FAILURE() << "saved into a symbolic link";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("step-00000001: a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir / "outside"));
}

TEST(UntrustedFs, TheMetricsFileIsNotAppendedThroughASymlink) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  write(dir / "victim", kPrecious);
  std::filesystem::create_directories(dir / "run");
  std::filesystem::create_symlink(dir / "victim", dir / "run" / "metrics.jsonl");
  const Result r = run(train_args(data, dir / "run") + " --metrics " + (dir / "run" / "metrics.jsonl").string());
  expect_refused(r, "metrics.jsonl", "a symbolic link");
  EXPECT_TRUE(untouched(dir / "victim"));
}

// Every command that writes an output from an input refuses an output that is the input, lies inside
// it or contains it (through `..` and symbolic links too), before writing or deleting anything.
TEST(UntrustedFs, AnOutputThatOverlapsItsInputIsRefusedAndTheInputSurvives) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::string run_dir = (dir / "run").string();
  const std::string step_dir = (dir / "run" / ckpt::step_dir_name(1)).string();
  ASSERT_EQ(run(train_args(data, dir / "run")).code, 0);
  Result r = run("convert consolidate " + run_dir + " -o " + (dir / "hf").string() + " -q");
  ASSERT_EQ(r.code, 0) << r.err;
  std::filesystem::create_directory_symlink(dir / "run", dir / "alias");
  testing::TempDir elsewhere;  // a way to the checkpoint that does not go through `dir`
  std::filesystem::create_directory_symlink(dir / "run", elsewhere / "run");
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data.string() +
          " --steps 1 --threads 1 --metrics " + (dir / "m.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string text = slurp(dir / "text.txt");
  const std::string metrics = slurp(dir / "m.jsonl");

  struct Case {
    std::string args;
    std::string says;
  };
  const std::string consolidate = "convert consolidate ";
  const std::vector<Case> cases = {
      {consolidate + run_dir + " -o " + run_dir + " --force", "is the input"},
      {consolidate + run_dir + " -o " + run_dir + "/../run --force", "is the input"},
      {consolidate + run_dir + " -o " + (dir / "alias").string() + " --force", "is the input"},
      {consolidate + step_dir + " -o " + step_dir + " --force --format hdf5", "is the input"},
      {consolidate + run_dir + " -o " + run_dir + "/export --format hdf5-virtual", "lies inside the input"},
      {consolidate + step_dir + " -o " + dir.path().string() + " --force", "contains the input"},
      {consolidate + (elsewhere / "run").string() + " -o " + dir.path().string() + " --force", "contains the input"},
      {"convert reshard " + run_dir + " -o " + run_dir + " --world-size 2 --force", "is the input"},
      {"convert reshard " + run_dir + " -o " + step_dir + "/more --world-size 2", "lies inside the input"},
      {"convert import " + (dir / "hf" / "model.safetensors").string() + " -o " + (dir / "hf").string() + " --force",
       "contains the input"},
      {"convert import " + (dir / "hf").string() + " -o " + (dir / "hf" / "ft").string(), "lies inside the input"},
      {"data encode " + (dir / "text.txt").string() + " -o " + (dir / "text.txt").string(), "is the input"},
      {"report " + (dir / "m.jsonl").string() + " -o " + (dir / "m.jsonl").string() + " --force", "is the input"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    expect_refused(run(c.args + " -q"), "", c.says);
  }
  EXPECT_EQ(run("ckpt verify " + run_dir).code, 0) << "the checkpoint survives";
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "export"));
  EXPECT_FALSE(std::filesystem::exists(dir / "hf" / "ft"));
  EXPECT_TRUE(std::filesystem::exists(dir / "hf" / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "hf" / "config.json"));
  EXPECT_EQ(slurp(dir / "text.txt"), text);
  EXPECT_EQ(slurp(dir / "m.jsonl"), metrics);
}

}  // namespace
}  // namespace shardkit
