// NVMe offload of the optimizer states (ZeRO-Infinity) on CPU ranks, with a temporary folder as the
// device: training swaps the states through files and trains bit for bit as without offload at
// stages 1-3, its checkpoints are the same bytes, and a resume writes a checkpoint's states back into
// the swap at the same and at another world size and stage. The swap files of a node's ranks are
// checked against the free space of their file system together, before any is created. Run at 1 and
// 2 ranks.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "base/error.hpp"
#include "base/sanitizers.hpp"
#include "base/text_format.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/layout.hpp"
#include "comm/mpi.hpp"
#include "model/registry.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/nvme/state_swapper.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/trainer.hpp"
#include "trainer/weight_decay.hpp"
#include "trainer/zero_engine.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world), world_size_(world.size()) {
    write_tokens("tokens.bin", 6000);
    if (world.rank() == 0) std::filesystem::create_directory(swap_dir());
    world.barrier();
  }

  std::filesystem::path swap_dir() const { return *this / "nvme"; }

  // Small buckets and 64 KiB chunks (16384 elements of each state: 14-27 chunks of gpt2-tiny's
  // partitions), so that reduction, gathering and the swap pipeline all run in many pieces. The
  // optimizer states are swapped to `nvme_path` and the parameters to `param_path` unless empty.
  static nlohmann::json config_json(int stage, const std::filesystem::path& nvme_path,
                                    const std::filesystem::path& param_path = {}) {
    nlohmann::json zero = {{"stage", stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 20000}};
    if (!nvme_path.empty()) {
      zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_path.string()}, {"buffer_count", 3}};
    }
    if (!param_path.empty()) zero["offload_param"] = {{"device", "nvme"}, {"nvme_path", param_path.string()}};
    return {{"train_batch_size", 8},
            {"gradient_accumulation_steps", 2},
            {"zero_optimization", zero},
            {"aio", {{"block_size", kChunkBytes}, {"queue_depth", 4}}},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"weight_decay", 0.01}}}}},
            {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 4}}}};
  }
  std::filesystem::path config(int stage, bool nvme) {
    return write_json((nvme ? "nvme" : "plain") + std::to_string(stage) + ".json",
                      config_json(stage, nvme ? swap_dir() : std::filesystem::path()));
  }
  // The parameters swapped (`stage`), the optimizer states too where `optimizer`.
  std::filesystem::path param_config(int stage, bool optimizer) {
    return write_json("params" + std::to_string(stage) + (optimizer ? "-optimizer" : "") + ".json",
                      config_json(stage, optimizer ? swap_dir() : std::filesystem::path(), swap_dir()));
  }
  static constexpr int64_t kChunkBytes = 65536;

  static std::string model_name() {
    return kUnderAddressSanitizer ? "llama-tiny" : "gpt2-tiny";  // ASan runs the smaller model
  }
  // The bytes of one rank's optimizer swap file at `stage` and this world size.
  int64_t swap_file_bytes(int stage) const {
    const ckpt::Layout layout(model::resolve_model(model_name())->table(),
                              {world_size_, stage, ckpt::kDefaultAlignment});
    trainer::nvme::SwapOptions o;
    o.chunk_bytes = kChunkBytes;
    return trainer::nvme::StateSwapper::need(o, layout.flat_size(), 3, "optimizer states").bytes;
  }

  TrainOptions options(const std::filesystem::path& config, int64_t steps) const {
    TrainOptions o;
    o.config = config;
    o.model = model_name();
    o.data = *this / "tokens.bin";
    o.steps = steps;
    o.resume = "none";
    o.seed = 7;
    o.threads = 1;
    o.quiet = true;
    return o;
  }

 private:
  int world_size_;
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

// A file system of `type` (tmpfs, ramfs) that rank 0 mounts at `at` for every rank (the tests run on
// one node), unmounted again on destruction; mounting needs root, so mounted() may be false.
class MountedDisk {
 public:
  MountedDisk(comm::MpiCollective& world, std::filesystem::path at, const std::string& type, const std::string& options)
      : world_(world), at_(std::move(at)) {
    int ok = 0;
    if (world.rank() == 0) {
      std::filesystem::create_directories(at_);
      ok = ::mount(type.c_str(), at_.c_str(), type.c_str(), 0, options.c_str()) == 0 ? 1 : 0;
    }
    world.broadcast_bytes(&ok, sizeof(ok));
    mounted_ = ok != 0;
  }
  ~MountedDisk() {
    world_.barrier();
    if (mounted_ && world_.rank() == 0) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool mounted() const noexcept { return mounted_; }
  const std::filesystem::path& path() const noexcept { return at_; }

 private:
  comm::MpiCollective& world_;
  std::filesystem::path at_;
  bool mounted_ = false;
};

// What `run` prints on standard output (the run's log, on rank 0).
template <typename F>
std::string stdout_of(F&& run) {
  std::fflush(stdout);
  std::FILE* capture = std::tmpfile();
  struct Restore {
    int saved;
    ~Restore() {
      std::fflush(stdout);
      ::dup2(saved, STDOUT_FILENO);
      ::close(saved);
    }
  };
  {
    const Restore restore{::dup(STDOUT_FILENO)};
    ::dup2(::fileno(capture), STDOUT_FILENO);
    run();
  }
  std::rewind(capture);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), capture)) > 0;) out.append(buffer, n);
  std::fclose(capture);
  return out;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

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

// Lion's two states swap as AdamW's three do: the same steps and states as in memory, its swap file
// sized for two states.
TEST(NvmeMpi, LionOffloadTrainsBitIdenticallyToNoOffload) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (int stage : {2, 3}) {
    const std::string what = "Lion, stage " + std::to_string(stage) + " on " + std::to_string(world.size()) + " ranks";
    const auto lion = [&](nlohmann::json config, const std::string& name) {
      config["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 2e-4}, {"weight_decay", 0.1}}}};
      TrainOptions o = ws.options(ws.write_json(name + ".json", config), 3);
      o.save_dir = ws / name;
      o.save_interval = 3;
      return o;
    };
    const TrainOptions plain = lion(Workspace::config_json(stage, {}), "lion-plain" + std::to_string(stage));
    const TrainOptions swapped =
        lion(Workspace::config_json(stage, ws.swap_dir()), "lion-nvme" + std::to_string(stage));
    const auto want = testing::train(world, plain);
    expect_same_steps(testing::train(world, swapped), want, 0, what);
    expect_same_states(plain.save_dir, swapped.save_dir, what);
    EXPECT_EQ(ckpt::CheckpointReader(swapped.save_dir).manifest().states,
              (std::vector<std::string>{"fp32", "exp_avg"}));
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

// Each rank's swap file fits the disk, two do not: with two ranks the run is refused at start-up on
// every rank, naming the folder, its free bytes, the node's total and the rank's share, before any
// file is created -- whether the ranks share the folder or have one each on that disk (free space is
// the file system's). One rank alone fits and trains.
TEST(NvmeMpi, SwapFilesThatFitOneByOneButNotTogetherAreRefusedBeforeAnyIsCreated) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const int stage = 2;
  const int64_t file = ws.swap_file_bytes(stage);
  const int64_t size = file * 3 / 2 / 4096 * 4096;
  const MountedDisk disk(world, ws / "small", "tmpfs", "size=" + std::to_string(size));
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  for (const bool own_folder : {false, true}) {
    const std::string what = own_folder ? "a folder per rank" : "one folder";
    const std::filesystem::path dir = own_folder ? disk.path() / ("rank" + std::to_string(world.rank())) : disk.path();
    std::filesystem::create_directories(dir);
    const std::filesystem::path config = ws / ("small-rank" + std::to_string(world.rank()) + ".json");
    std::ofstream(config) << Workspace::config_json(stage, dir).dump();
    world.barrier();
    const TrainOptions o = ws.options(config, 1);
    if (world.size() == 1) {
      EXPECT_EQ(testing::train(world, o).size(), 1u) << what;
      continue;
    }
    std::string error;
    try {
      testing::train(world, o);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      error = e.what();
    }
    const std::string free = format_bytes(static_cast<double>(size));
    EXPECT_EQ(
        error.rfind(dir.string() + ": " + free + " free, but the swap files of the 2 ranks on this node need " +
                        format_bytes(2.0 * static_cast<double>(file)) + " on its file system (this rank's share " +
                        format_bytes(static_cast<double>(file)) + ": the optimizer states of this rank's ",
                    0),
        0u)
        << what << ": " << error;
    world.barrier();
    for (const auto& e : std::filesystem::recursive_directory_iterator(disk.path())) {
      EXPECT_FALSE(e.is_regular_file()) << what << ": " << e.path() << " was created";
    }
  }
}

// A swap folder on a file system without O_DIRECT (ramfs; tmpfs too before Linux 6.6): the swap falls
// back to buffered I/O, rank 0's log says so once, and training is bit for bit as without offload.
TEST(NvmeMpi, AFolderWithoutODirectFallsBackToBufferedIoAndTrainsTheSame) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const MountedDisk disk(world, ws / "ramfs", "ramfs", "");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a ramfs here (needs root)";
  TrainOptions plain = ws.options(ws.config(1, false), 2);
  plain.save_dir = ws / "plain";
  TrainOptions swapped = ws.options(ws.write_json("ramfs.json", Workspace::config_json(1, disk.path())), 2);
  swapped.save_dir = ws / "swapped";
  swapped.quiet = false;
  const auto want = testing::train(world, plain);
  std::vector<StepRecord> got;
  const std::string log = stdout_of([&] { got = testing::train(world, swapped); });
  expect_same_steps(got, want, 0, "buffered swap");
  expect_same_states(plain.save_dir, swapped.save_dir, "buffered swap");
  if (world.rank() == 0) {
    EXPECT_EQ(count_of(log, disk.path().string() + " does not support O_DIRECT"), 1u) << log;
    EXPECT_EQ(count_of(log, "buffered I/O"), 1u) << log;
    EXPECT_NE(log.find("optimizer states swapped to " + disk.path().string() + "/shardkit-"), std::string::npos) << log;
    EXPECT_NE(log.find(" (buffered)"), std::string::npos) << log;
  }
}

// Stage 3 with the parameter partition on NVMe, the optimizer states in memory or on NVMe too: the
// gathers read each bucket's slice from the swap file and the step writes the slice back, bit for
// bit as without offload; one more swap file per rank, and the memory line says where they are.
TEST(NvmeMpi, ParameterOffloadTrainsBitIdenticallyToNoOffloadAtStage3) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  TrainOptions plain = ws.options(ws.config(3, false), 3);
  plain.save_dir = ws / "plain";
  const auto want = testing::train(world, plain);
  for (const bool optimizer : {false, true}) {
    const std::string what = std::string("parameters") + (optimizer ? " and optimizer states" : "") + " on " +
                             std::to_string(world.size()) + " ranks";
    TrainOptions swapped = ws.options(ws.param_config(3, optimizer), 3);
    swapped.save_dir = ws / (optimizer ? "both" : "params");
    swapped.quiet = false;
    std::optional<SwapWatcher> watcher;
    if (world.rank() == 0) watcher.emplace(ws.swap_dir());
    std::vector<StepRecord> got;
    const std::string log = stdout_of([&] { got = testing::train(world, swapped); });
    expect_same_steps(got, want, 0, what);
    expect_same_states(plain.save_dir, swapped.save_dir, what);
    const std::set<std::string> seen = watcher ? watcher->stop() : std::set<std::string>{};
    if (world.rank() == 0) {
      EXPECT_EQ(seen.size(), static_cast<size_t>(world.size() * (optimizer ? 2 : 1))) << what;
      size_t params = 0;
      for (const std::string& name : seen) params += name.find("-params-rank") != std::string::npos ? 1 : 0;
      EXPECT_EQ(params, static_cast<size_t>(world.size())) << what << ": one parameter swap file per rank";
      const size_t line = log.find("rank 0: parameters ");
      ASSERT_NE(line, std::string::npos) << log;
      const std::string memory = log.substr(line, log.find('\n', line) - line);
      EXPECT_NE(memory.find(" (on NVMe), gradients "), std::string::npos) << memory;
      EXPECT_EQ(memory.find("optimizer states ") != std::string::npos &&
                    memory.find(" (on NVMe), activations") != std::string::npos,
                optimizer)
          << memory;
      EXPECT_NE(log.find("parameters swapped to " + ws.swap_dir().string() + "/shardkit-"), std::string::npos) << log;
      EXPECT_EQ(log.find("optimizer states swapped to ") != std::string::npos, optimizer) << log;
    }
    world.barrier();
    EXPECT_TRUE(std::filesystem::is_empty(ws.swap_dir())) << what << ": a swap file outlived its run";
  }
}

// Stage 3's gathers read the first slice of the group the model is likely to need next while it
// computes; a read ahead still pending when the swap is written (a step, a load) must not serve the
// parameters from before. Gathers groups 1 and 2 (starting the read of group 3's first bucket),
// writes every state anew, then gathers group 3: it holds the new values.
TEST(NvmeMpi, AReadAheadNeverServesParametersFromBeforeTheSwapWasWritten) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const auto model = model::resolve_model(Workspace::model_name());
  ASSERT_GE(model->groups().size(), 4u);
  const auto value = [](int tensor, int64_t i, float base) {
    return base + 0.01f * static_cast<float>(tensor) + 1e-6f * static_cast<float>(i % 1000);
  };
  const auto init = [&](float base) {
    return [&, base](int tensor, int64_t offset, std::span<float> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = value(tensor, offset + static_cast<int64_t>(i), base);
    };
  };
  for (const bool optimizer : {false, true}) {
    const trainer::DsConfig config = trainer::parse_ds_config(
        Workspace::config_json(3, optimizer ? ws.swap_dir() : std::filesystem::path(), ws.swap_dir()), world.size(), {},
        "read-ahead.json");
    trainer::ZeroEngine engine(
        model->table(), model->groups(), trainer::decay_flags(*model), config.zero,
        trainer::optimizer(trainer::OptimizerKind::kAdamW), ckpt::DType::kF32, world,
        trainer::nvme::swap_factory(config, false, sizeof(float), 3, world, [](const std::string&) {}));
    engine.initialize(init(1.0f));
    for (const int group : {1, 2}) {
      engine.acquire(group);
      engine.release(group);
    }
    engine.initialize(init(2.0f));
    const model::TensorGroup& g = model->groups()[3];
    engine.acquire(3);
    for (int t = g.first; t < g.last; ++t) {
      const float* p = engine.param(t);
      const int64_t n = model->table()[static_cast<size_t>(t)].numel();
      int64_t stale = 0;
      for (int64_t i = 0; i < n; ++i) stale += p[i] != value(t, i, 2.0f);
      EXPECT_EQ(stale, 0) << model->table()[static_cast<size_t>(t)].name << (optimizer ? ", optimizer swapped" : "");
    }
    engine.release(3);
  }
}

// The checkpoint format does not depend on where the states lived: a stage 3 checkpoint saved with
// the parameters (and optimizer states) on NVMe resumes without offload, and one saved without
// resumes with it, both bit for bit as the run that was not interrupted.
TEST(NvmeMpi, ACheckpointOfParameterOffloadResumesWithoutItAndViceVersa) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  TrainOptions plain = ws.options(ws.config(3, false), 4);
  plain.save_dir = ws / "plain";
  plain.save_interval = 2;
  const auto want = testing::train(world, plain);
  TrainOptions swapped = ws.options(ws.param_config(3, true), 4);
  swapped.save_dir = ws / "swapped";
  swapped.save_interval = 2;
  expect_same_steps(testing::train(world, swapped), want, 0, "uninterrupted with offload");

  TrainOptions without = plain;
  without.save_dir = ws / "without";
  without.resume = (swapped.save_dir / "step-00000002").string();
  expect_same_steps(testing::train(world, without), want, 2, "offloaded checkpoint resumed without offload");
  expect_same_states(plain.save_dir, without.save_dir, "offloaded checkpoint resumed without offload");

  TrainOptions with = ws.options(ws.param_config(3, false), 4);
  with.save_dir = ws / "with";
  with.resume = (plain.save_dir / "step-00000002").string();
  expect_same_steps(testing::train(world, with), want, 2, "plain checkpoint resumed with parameter offload");
  expect_same_states(plain.save_dir, with.save_dir, "plain checkpoint resumed with parameter offload");
  world.barrier();
  EXPECT_TRUE(std::filesystem::is_empty(ws.swap_dir()));
}

// DeepSpeed offloads parameters only at stage 3, where they are partitioned: stages 0-2 are refused
// at start-up with one line naming the setting, and nothing is created in the folder.
TEST(NvmeMpi, ParameterOffloadIsRefusedBelowStage3) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (int stage = 0; stage <= 2; ++stage) {
    std::string error;
    try {
      testing::train(world, ws.options(ws.param_config(stage, false), 1));
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      error = e.what();
    }
    EXPECT_EQ(error, "zero_optimization.offload_param device nvme needs ZeRO stage 3 (stage " + std::to_string(stage) +
                         " keeps every parameter on every rank)");
    EXPECT_TRUE(std::filesystem::is_empty(ws.swap_dir()));
  }
}

}  // namespace
}  // namespace shardkit
