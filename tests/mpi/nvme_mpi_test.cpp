// NVMe offload of the optimizer states (ZeRO-Infinity) on CPU ranks, with a temporary folder as the
// device: training swaps the states through files and trains bit for bit as without offload at
// stages 1-3, its checkpoints are the same bytes, and a resume writes a checkpoint's states back into
// the swap at the same and at another world size and stage. Run at 1 and 2 ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/sanitizers.hpp"
#include "comm/mpi.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world) {
    write_tokens("tokens.bin", 6000);
    if (world.rank() == 0) std::filesystem::create_directory(swap_dir());
    world.barrier();
  }

  std::filesystem::path swap_dir() const { return *this / "nvme"; }

  // Small buckets and 64 KiB chunks (16384 elements of each state: 14-27 chunks of gpt2-tiny's
  // partitions), so that reduction, gathering and the swap pipeline all run in many pieces.
  std::filesystem::path config(int stage, bool nvme) {
    nlohmann::json zero = {{"stage", stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 20000}};
    if (nvme) {
      zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap_dir().string()}, {"buffer_count", 3}};
    }
    return write_json((nvme ? "nvme" : "plain") + std::to_string(stage) + ".json",
                      {{"train_batch_size", 8},
                       {"gradient_accumulation_steps", 2},
                       {"zero_optimization", zero},
                       {"aio", {{"block_size", 65536}, {"queue_depth", 4}}},
                       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"weight_decay", 0.01}}}}},
                       {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 4}}}});
  }

  TrainOptions options(const std::filesystem::path& config, int64_t steps) const {
    TrainOptions o;
    o.config = config;
    o.model = kUnderAddressSanitizer ? "llama-tiny" : "gpt2-tiny";  // ASan runs the smaller model
    o.data = *this / "tokens.bin";
    o.steps = steps;
    o.resume = "none";
    o.seed = 7;
    o.threads = 1;
    o.quiet = true;
    return o;
  }
};

// Watches the swap folder while it lives: the names of the files seen there (a run that did not swap,
// e.g. one that took nvme for a no-op, leaves it empty throughout).
class SwapWatcher {
 public:
  explicit SwapWatcher(std::filesystem::path dir)
      : dir_(std::move(dir)), thread_([this] {
          while (!stop_.load()) {
            std::error_code ec;
            for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) seen_.insert(e.path().filename());
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  ~SwapWatcher() { stop(); }
  const std::set<std::string>& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return seen_;
  }

 private:
  std::filesystem::path dir_;
  std::atomic<bool> stop_{false};
  std::set<std::string> seen_;
  std::thread thread_;
};

void expect_same_steps(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want, size_t offset,
                       const std::string& what) {
  ASSERT_EQ(got.size() + offset, want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i + offset].step) << what;
    EXPECT_EQ(got[i].loss, want[i + offset].loss) << what << " step " << got[i].step;
    EXPECT_EQ(got[i].grad_norm, want[i + offset].grad_norm) << what << " step " << got[i].step;
  }
}

void expect_same_states(const std::filesystem::path& a, const std::filesystem::path& b, const std::string& what) {
  ckpt::CheckpointReader ra(a), rb(b);
  const ckpt::DiffReport diff = ckpt::diff_checkpoints(ra, rb);
  ASSERT_FALSE(diff.entries.empty()) << what;
  for (const auto& e : diff.entries) EXPECT_EQ(e.differing, 0) << what << ": " << e.tensor << " " << e.state;
}

TEST(NvmeMpi, OffloadTrainsBitIdenticallyToNoOffloadAtStages1To3) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (int stage = 1; stage <= 3; ++stage) {
    const std::string what = "stage " + std::to_string(stage) + " on " + std::to_string(world.size()) + " ranks";
    TrainOptions plain = ws.options(ws.config(stage, false), 3);
    plain.save_dir = ws / ("plain" + std::to_string(stage));
    plain.save_interval = 3;
    TrainOptions swapped = ws.options(ws.config(stage, true), 3);
    swapped.save_dir = ws / ("nvme" + std::to_string(stage));
    swapped.save_interval = 3;
    const auto want = testing::train(world, plain);
    std::optional<SwapWatcher> watcher;  // the folder is shared: rank 0 watches it for all
    if (world.rank() == 0) watcher.emplace(ws.swap_dir());
    expect_same_steps(testing::train(world, swapped), want, 0, what);
    const std::set<std::string> seen = watcher ? watcher->stop() : std::set<std::string>{};
    if (world.rank() == 0) {
      EXPECT_EQ(seen.size(), static_cast<size_t>(world.size())) << what << ": one swap file per rank";
    }
    for (const std::string& name : seen) {
      EXPECT_NE(name.find("-optimizer-rank"), std::string::npos) << name;
      EXPECT_NE(name.find("-of-" + std::to_string(world.size()) + ".swap"), std::string::npos) << name;
    }
    expect_same_states(plain.save_dir, swapped.save_dir, what);
    world.barrier();
    EXPECT_TRUE(std::filesystem::is_empty(ws.swap_dir())) << what << ": a swap file outlived its run";
  }
}

TEST(NvmeMpi, ResumeRefillsTheSwapAtTheSameAndAtAnotherWorldSizeAndStage) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  TrainOptions full = ws.options(ws.config(2, true), 6);
  full.save_dir = ws / "full";
  full.save_interval = 3;
  const auto uninterrupted = testing::train(world, full);

  // Same world size and stage: bit for bit, the final states included.
  TrainOptions resumed = full;
  resumed.save_dir = ws / "resumed";
  resumed.resume = (full.save_dir / "step-00000003").string();
  expect_same_steps(testing::train(world, resumed), uninterrupted, 3, "resumed at the same world size");
  expect_same_states(full.save_dir, resumed.save_dir, "resumed at the same world size");

  // One rank at stage 3, swapped too: the sums run in another order, so close, not equal.
  TrainOptions one = ws.options(ws.config(3, true), 6);
  one.resume = resumed.resume;
  const auto continued = testing::train_on_rank0(world, one);
  ASSERT_EQ(continued.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(continued[i].loss, uninterrupted[i + 3].loss, 1e-5 * uninterrupted[i + 3].loss);
  }
  world.barrier();
  EXPECT_TRUE(std::filesystem::is_empty(ws.swap_dir()));
}

}  // namespace
}  // namespace shardkit
