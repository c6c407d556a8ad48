// Asynchronous checkpoints: they hold exactly what synchronous ones hold and leave the training run
// unchanged; a save that fails in the background (as one cut short by a crash) fails the run on every
// rank and leaves the previous checkpoint as `latest`, from which the run resumes bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/shard_format.hpp"
#include "comm/mpi.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world) { write_tokens("tokens.bin", 6000); }

  TrainOptions options(int stage, const std::string& name, trainer::SaveMode save_mode) {
    TrainOptions o;
    o.config = write_json(
        name + ".json",
        {{"train_batch_size", 12},
         {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 20000}}},
         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"weight_decay", 0.01}}}}}});
    o.model = "gpt2-tiny";
    o.data = path() / "tokens.bin";
    o.steps = 6;
    o.resume = "none";
    o.seed = 11;
    o.threads = 1;
    o.quiet = true;
    o.save_dir = path() / name;
    o.save_interval = 2;
    o.save_mode = save_mode;
    return o;
  }
};

using testing::train;

void expect_same_checkpoint(const std::filesystem::path& a, const std::filesystem::path& b) {
  ckpt::CheckpointReader ra(a), rb(b);
  const ckpt::DiffReport diff = ckpt::diff_checkpoints(ra, rb);
  ASSERT_FALSE(diff.entries.empty());
  for (const auto& e : diff.entries) EXPECT_EQ(e.differing, 0) << a << " " << e.tensor << " " << e.state;
  EXPECT_EQ(ra.manifest().trainer_state, rb.manifest().trainer_state) << a;
  for (const auto& entry : std::filesystem::directory_iterator(a)) {
    if (entry.path().extension() != ".h5") continue;
    EXPECT_EQ(entry.file_size(), std::filesystem::file_size(b / entry.path().filename())) << entry.path();
  }
}

TEST(CheckpointMpi, AsyncSavesHoldWhatSyncSavesHoldAndLeaveTheRunUnchanged) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (int stage : {2, 3}) {
    const std::string s = std::to_string(stage);
    const TrainOptions sync = ws.options(stage, "sync" + s, trainer::SaveMode::kSync);
    const TrainOptions async = ws.options(stage, "async" + s, trainer::SaveMode::kAsync);
    const auto a = train(world, sync);
    const auto b = train(world, async);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << "stage " << s << " step " << a[i].step;
      EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "stage " << s << " step " << a[i].step;
    }
    for (const char* step : {"step-00000002", "step-00000004", "step-00000006"}) {
      expect_same_checkpoint(sync.save_dir / step, async.save_dir / step);
    }
    EXPECT_EQ(ckpt::CheckpointReader(async.save_dir).manifest().step, 6) << "latest follows the last commit";
  }
}

// A failed background save fails alike on every rank. By default the run goes on (the next save is
// tried; training results are unchanged); with stop_on_save_error it ends, and a restart resumes from
// the previous checkpoint exactly. (A failure on one rank only: tests/cli/fault_test.cpp.)
TEST(CheckpointMpi, AFailedBackgroundSaveIsReportedTheRunGoesOnOrStopsAndResumesExactly) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const auto reference = train(world, ws.options(2, "reference", trainer::SaveMode::kSync));
  // The save of step 4 cannot create its directory: a file stands where it must go (a file, not a
  // directory without a manifest, which the trainer would clear away at start as a killed save's).
  auto block = [&](const TrainOptions& run) {
    if (world.rank() == 0) {
      std::filesystem::create_directories(run.save_dir);
      std::ofstream(run.save_dir / "step-00000004") << "in the way";
    }
    world.barrier();
  };

  TrainOptions goes_on = ws.options(2, "goes-on", trainer::SaveMode::kAsync);
  goes_on.resume = "auto";  // the directory holds no checkpoint yet: the run starts fresh
  block(goes_on);
  const auto records = train(world, goes_on);
  ASSERT_EQ(records.size(), reference.size());
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(records[i].loss, reference[i].loss);
  EXPECT_TRUE(std::filesystem::is_regular_file(goes_on.save_dir / "step-00000004")) << "not the save's to remove";
  EXPECT_EQ(ckpt::CheckpointReader(goes_on.save_dir).manifest().step, 6) << "the next save was tried";

  TrainOptions stops = ws.options(2, "stops", trainer::SaveMode::kAsync);
  stops.resume = "auto";
  stops.stop_on_save_error = true;
  block(stops);
  try {
    train(world, stops);
    ADD_FAILURE() << "the run survived a failed checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-00000004"), std::string::npos) << e.what();
  }
  world.barrier();
  EXPECT_EQ(ckpt::CheckpointReader(stops.save_dir).manifest().step, 2) << "latest is the last committed checkpoint";
  if (world.rank() == 0) std::filesystem::remove(stops.save_dir / "step-00000004");
  world.barrier();
  stops.stop_on_save_error = false;
  const auto continued = train(world, stops);
  ASSERT_EQ(continued.size(), 4u);
  for (size_t i = 0; i < continued.size(); ++i) {
    EXPECT_EQ(continued[i].step, reference[i + 2].step);
    EXPECT_EQ(continued[i].loss, reference[i + 2].loss) << "step " << continued[i].step;
  }
  expect_same_checkpoint(ws.options(2, "reference", trainer::SaveMode::kSync).save_dir / "step-00000006",
                         stops.save_dir / "step-00000006");
}

}  // namespace
}  // namespace shardkit
