// Asynchronous checkpoints: they hold exactly what synchronous ones hold and leave the training run
// unchanged; a save that fails in the background (as one cut short by a crash) fails the run on every
// rank and leaves the previous checkpoint as `latest`, from which the run resumes bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/error.hpp"
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

  TrainOptions options(int stage, const std::string& name, const std::string& save_mode) {
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
    const TrainOptions sync = ws.options(stage, "sync" + s, "sync");
    const TrainOptions async = ws.options(stage, "async" + s, "async");
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

TEST(CheckpointMpi, AFailedBackgroundSaveFailsTheRunAndTheRunResumesFromThePreviousOne) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const auto reference = train(world, ws.options(2, "reference", "sync"));

  TrainOptions run = ws.options(2, "broken", "async");
  // The last rank cannot create its shard of step 4: a directory stands where its file must go.
  const std::filesystem::path blocker =
      run.save_dir / "step-00000004" / (ckpt::shard_file_name(world.size() - 1, world.size()) + ".tmp");
  if (world.rank() == 0) std::filesystem::create_directories(blocker / "x");
  world.barrier();
  try {
    train(world, run);
    ADD_FAILURE() << "the run survived a failed checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(world.size() - 1)), std::string::npos) << e.what();
  }
  world.barrier();
  EXPECT_FALSE(std::filesystem::exists(run.save_dir / "step-00000004" / "manifest.json"));
  EXPECT_EQ(ckpt::CheckpointReader(run.save_dir).manifest().step, 2) << "latest is the last committed checkpoint";

  // Restart: what the crash left behind is cleared up by the next save of that step.
  if (world.rank() == 0) std::filesystem::remove_all(blocker);
  world.barrier();
  TrainOptions resumed = run;
  resumed.resume = "auto";
  const auto continued = train(world, resumed);
  ASSERT_EQ(continued.size(), 4u);
  for (size_t i = 0; i < continued.size(); ++i) {
    EXPECT_EQ(continued[i].step, reference[i + 2].step);
    EXPECT_EQ(continued[i].loss, reference[i + 2].loss) << "step " << continued[i].step;
  }
  expect_same_checkpoint(ws.options(2, "reference", "sync").save_dir / "step-00000006", run.save_dir / "step-00000006");
}

}  // namespace
}  // namespace shardkit
