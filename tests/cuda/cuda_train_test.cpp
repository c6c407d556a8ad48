// The CUDA backend against the CPU reference: the fp32 GPU path follows the CPU losses to 1e-4, bf16
// tracks the fp32 curve within 2 %, every ZeRO stage agrees at this world size, offload_param and NVMe
// offload change nothing but where the states are kept, and checkpoints move between GPU and CPU runs and
// between world sizes. Skipped (with a message) without enough GPUs, except the config refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "comm/mpi.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

// A shared directory with a token file and fp32/bf16 configs.
class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world) { write_tokens("tokens.bin", 60000); }

  // `zero` is merged into the zero_optimization section, `top` into the top level.
  std::filesystem::path config(int stage, const std::string& precision, const std::string& name, bool offload = false,
                               const nlohmann::json& zero = nlohmann::json::object(),
                               const nlohmann::json& top = nlohmann::json::object()) {
    nlohmann::json j = {
        {"train_batch_size", 8},
        {"gradient_accumulation_steps", 2},
        {"gradient_clipping", 1.0},
        {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 50000}, {"allgather_bucket_size", 60000}}},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}}};
    if (precision == "bf16") j["bf16"] = {{"enabled", true}};
    // A dynamic loss scale that grows every 4 steps without an overflow: it changes during a short run.
    if (precision == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}, {"loss_scale_window", 4}};
    if (offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    // A braced {} argument arrives as a JSON null, which update() refuses: it means no settings.
    if (!zero.is_null()) j["zero_optimization"].update(zero);
    if (!top.is_null()) j.update(top);
    return write_json(name + ".json", j);
  }
};

TrainOptions options(const std::filesystem::path& config, const std::filesystem::path& data, int64_t steps,
                     const std::string& device) {
  TrainOptions o;
  o.config = config;
  o.model = "gpt2-tiny";
  o.data = data;
  o.steps = steps;
  o.resume = "none";
  o.seed = 3;
  o.device = device == "cuda" ? trainer::ComputeDevice::kCuda : trainer::ComputeDevice::kCpu;
  o.quiet = true;
  o.threads = 4;
  return o;
}

using testing::train;

// A run with its console output (printed by rank 0), for the start-up report's lines.
struct Shown {
  std::vector<StepRecord> records;
  std::string console;
};
Shown train_shown(comm::MpiCollective& world, TrainOptions options) {
  options.quiet = false;
  ::testing::internal::CaptureStdout();
  Shown out;
  try {
    out.records = train(world, options);
  } catch (...) {
    // gtest's report of the error would go to the captured output, which nobody reads.
    std::cout << ::testing::internal::GetCapturedStdout();
    throw;
  }
  out.console = ::testing::internal::GetCapturedStdout();
  return out;
}

void expect_close(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want, size_t offset, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size() + offset, want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i + offset].loss, rtol * want[i + offset].loss) << what << " step " << got[i].step;
  }
}

TEST(CudaTrain, Fp32FollowsTheCpuReference) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const auto config = ws.config(0, "fp32", "fp32");
  const auto cpu = train(world, options(config, ws / "tokens.bin", 8, "cpu"));
  const auto gpu = train(world, options(config, ws / "tokens.bin", 8, "cuda"));
  expect_close(gpu, cpu, 0, 1e-4, "fp32 GPU vs CPU");
}

TEST(CudaTrain, Bf16TracksTheFp32CurveWithinTwoPercent) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const auto cpu = train(world, options(ws.config(1, "fp32", "fp32"), ws / "tokens.bin", 200, "cpu"));
  const auto gpu = train(world, options(ws.config(1, "bf16", "bf16"), ws / "tokens.bin", 200, "cuda"));
  ASSERT_EQ(gpu.size(), cpu.size());
  EXPECT_LT(cpu.back().loss, cpu.front().loss * 0.8) << "the reference does not learn";
  for (size_t i = 0; i < gpu.size(); i += 10) {
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, 0.02 * cpu[i].loss) << "step " << gpu[i].step;
  }
}

TEST(CudaTrain, EveryStageAgrees) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const auto reference = train(world, options(ws.config(0, "fp32", "s0"), ws / "tokens.bin", 6, "cuda"));
  for (int stage = 1; stage <= 3; ++stage) {
    const auto got =
        train(world, options(ws.config(stage, "fp32", "s" + std::to_string(stage)), ws / "tokens.bin", 6, "cuda"));
    expect_close(got, reference, 0, 1e-5, "stage " + std::to_string(stage));
  }
  // Stages 2 and 3 with communication on its own stream (reductions overlapped with the backward pass,
  // stage 3 prefetching the next block) and without; gradient accumulation makes prefetches cross
  // micro-batches, and the optimizer step must not use a gather issued before it.
  for (int stage = 2; stage <= 3; ++stage) {
    for (const bool overlap : {false, true}) {
      const std::string name = "o" + std::to_string(stage) + (overlap ? "on" : "off");
      const auto got = train(world, options(ws.config(stage, "fp32", name, false, {{"overlap_comm", overlap}}),
                                            ws / "tokens.bin", 6, "cuda"));
      expect_close(got, reference, 0, 1e-5, name);
    }
  }
}

// Stages 0-1 replay the forward and backward passes as a CUDA graph unless wall_clock_breakdown times
// them apart: the replayed kernels give the bits of the kernels launched one by one, also across the
// fp16 loss scale's changes (each captures the graph again).
TEST(CudaTrain, GraphReplayGivesTheBitsOfKernelByKernel) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  for (const std::string precision : {"bf16", "fp16", "fp32"}) {
    for (int stage = 0; stage <= 1; ++stage) {
      const std::string name = precision + "s" + std::to_string(stage);
      const auto replayed = train(world, options(ws.config(stage, precision, name), ws / "tokens.bin", 12, "cuda"));
      const auto launched = train(world, options(ws.config(stage, precision, name + "timed", false,
                                                           nlohmann::json::object(), {{"wall_clock_breakdown", true}}),
                                                 ws / "tokens.bin", 12, "cuda"));
      ASSERT_EQ(replayed.size(), launched.size());
      for (size_t i = 0; i < replayed.size(); ++i) {
        EXPECT_EQ(replayed[i].loss, launched[i].loss) << name << " step " << replayed[i].step;
        // Bits, not values: a step skipped for an overflow has a NaN norm.
        EXPECT_EQ(std::bit_cast<uint64_t>(replayed[i].grad_norm), std::bit_cast<uint64_t>(launched[i].grad_norm))
            << name << " step " << replayed[i].step;
        EXPECT_EQ(replayed[i].loss_scale, launched[i].loss_scale) << name << " step " << replayed[i].step;
      }
      if (precision == "fp16") {
        EXPECT_NE(replayed.front().loss_scale, replayed.back().loss_scale) << "the scale never changed";
      }
    }
  }
}

// communication_data_type bf16 (gradients reduced in bf16: grad_wire_cuda_test.cpp checks the
// reductions themselves) trains like fp32 reductions at every stage that reduces, with overlapped
// communication and two micro-batches a step.
TEST(CudaTrain, Bf16CommunicationTrainsLikeFp32Communication) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const auto reference = train(world, options(ws.config(2, "bf16", "wire32"), ws / "tokens.bin", 20, "cuda"));
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = "wire16s" + std::to_string(stage);
    const auto got = train(world, options(ws.config(stage, "bf16", name, false, {{"overlap_comm", true}},
                                                    {{"communication_data_type", "bf16"}}),
                                          ws / "tokens.bin", 20, "cuda"));
    expect_close(got, reference, 0, 1e-2, name);
  }
}

// ZeRO-Offload: the CPU AdamW gives the GPU optimizer's losses at every stage and in bf16, and an
// offloaded run's checkpoint resumes without offload (it is the same checkpoint).
TEST(CudaTrain, CpuOptimizerOffloadMatchesTheGpuOptimizer) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  for (int stage = 1; stage <= 3; ++stage) {
    const std::string s = std::to_string(stage);
    const auto on_gpu = train(world, options(ws.config(stage, "fp32", "gpu" + s), ws / "tokens.bin", 6, "cuda"));
    const auto offloaded =
        train(world, options(ws.config(stage, "fp32", "off" + s, true), ws / "tokens.bin", 6, "cuda"));
    expect_close(offloaded, on_gpu, 0, 1e-5, "offloaded stage " + s);
  }
  const auto bf16 = train(world, options(ws.config(2, "bf16", "bf16"), ws / "tokens.bin", 20, "cuda"));
  TrainOptions off = options(ws.config(2, "bf16", "bf16off", true), ws / "tokens.bin", 20, "cuda");
  off.save_dir = ws / "offloaded";
  off.save_interval = 10;
  expect_close(train(world, off), bf16, 0, 1e-3, "offloaded bf16");
  TrainOptions resumed = options(ws.config(2, "bf16", "bf16on"), ws / "tokens.bin", 20, "cuda");
  resumed.resume = (off.save_dir / "step-00000010").string();
  expect_close(train(world, resumed), bf16, 10, 1e-3, "offloaded checkpoint resumed on the GPU optimizer");
}

// Lion (one moment; each element moves by lr times the sign of an interpolation) through the GPU's
// kernel follows the CPU reference at every stage, and the host optimizer of offload_optimizer gives the
// kernel's losses. A sign taken of a sum that rounds differently moves one element by 2 lr: with lr 1e-4
// the losses still agree to 1e-4.
TEST(CudaTrain, LionFollowsTheCpuReferenceOnTheDeviceAndOffloaded) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const nlohmann::json lion = {
      {"optimizer", {{"type", "Lion"}, {"params", {{"lr", 1e-4}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.1}}}}}};
  const auto cpu =
      train(world, options(ws.config(0, "fp32", "lion-cpu", false, {}, lion), ws / "tokens.bin", 8, "cpu"));
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string s = std::to_string(stage);
    const auto on_gpu =
        train(world, options(ws.config(stage, "fp32", "lion-gpu" + s, false, {}, lion), ws / "tokens.bin", 8, "cuda"));
    expect_close(on_gpu, cpu, 0, 1e-4, "Lion on the GPU, stage " + s);
    if (stage == 0) continue;  // offload_optimizer is a ZeRO setting: stages 1-3
    const auto offloaded =
        train(world, options(ws.config(stage, "fp32", "lion-off" + s, true, {}, lion), ws / "tokens.bin", 8, "cuda"));
    expect_close(offloaded, on_gpu, 0, 1e-5, "Lion offloaded, stage " + s);
  }
}

// offload_param at stage 3 changes where the rank's partition of the parameters is stored, not the
// arithmetic: the losses are those of the partition in device memory bit for bit, with the GPU
// optimizer and with offload_optimizer, in fp32 and bf16 (gathers prefetched, several buckets per
// group). The start-up report says where the partition is.
TEST(CudaTrain, ParameterOffloadMatchesStage3BitForBit) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  // Bit for bit needs a reference that reproduces itself (no reduction order left to chance).
  const auto reference = train(world, options(ws.config(3, "fp32", "again"), ws / "tokens.bin", 6, "cuda"));
  expect_close(train(world, options(ws.config(3, "fp32", "again"), ws / "tokens.bin", 6, "cuda")), reference, 0, 0.0,
               "stage 3 run twice");
  const nlohmann::json to_host = {{"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}};
  for (const std::string precision : {"fp32", "bf16"}) {
    for (const bool cpu_optimizer : {false, true}) {
      const std::string name = precision + (cpu_optimizer ? "-cpu-optimizer" : "-gpu-optimizer");
      const auto on_device =
          train(world, options(ws.config(3, precision, name, cpu_optimizer), ws / "tokens.bin", 6, "cuda"));
      const Shown on_host =
          train_shown(world, options(ws.config(3, precision, name + "-offload-param", cpu_optimizer, to_host),
                                     ws / "tokens.bin", 6, "cuda"));
      expect_close(on_host.records, on_device, 0, 0.0, name + " with offload_param");
      if (world.rank() == 0) {
        EXPECT_NE(on_host.console.find("(in host memory), gradients"), std::string::npos) << name << ":\n"
                                                                                          << on_host.console;
      }
    }
  }
}

// A checkpoint does not record where the parameters were: saved with offload_param it resumes without,
// and the reverse, continuing the uninterrupted run's losses bit for bit -- with the GPU optimizer
// and with offload_optimizer (bf16, so that loading narrows the weights into the host partition).
TEST(CudaTrain, ParameterOffloadCheckpointsResumeWithoutIt) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  const nlohmann::json to_host = {{"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}};
  for (const bool cpu_optimizer : {false, true}) {
    const std::string s = cpu_optimizer ? "-cpu-optimizer" : "-gpu-optimizer";
    // Uninterrupted with offload_param, saving at step 3.
    TrainOptions full = options(ws.config(3, "bf16", "host" + s, cpu_optimizer, to_host), ws / "tokens.bin", 8, "cuda");
    full.save_dir = ws / ("host" + s);
    full.save_interval = 3;
    const auto uninterrupted = train(world, full);
    // Its step 3 without offload_param, saving at step 5.
    TrainOptions device = options(ws.config(3, "bf16", "device" + s, cpu_optimizer), ws / "tokens.bin", 8, "cuda");
    device.resume = (full.save_dir / "step-00000003").string();
    device.save_dir = ws / ("device" + s);
    device.save_interval = 5;
    expect_close(train(world, device), uninterrupted, 3, 0.0, "offload_param -> device" + s);
    // That step 5 with offload_param again.
    TrainOptions back = options(ws.config(3, "bf16", "back" + s, cpu_optimizer, to_host), ws / "tokens.bin", 8, "cuda");
    back.resume = (device.save_dir / "step-00000005").string();
    expect_close(train(world, back), uninterrupted, 5, 0.0, "device -> offload_param" + s);
  }
}

// The NVMe tests' swap folder, made by rank 0 before any rank uses it.
std::string swap_folder(comm::MpiCollective& world, const Workspace& ws) {
  if (world.rank() == 0) std::filesystem::create_directory(ws / "nvme");
  world.barrier();
  return (ws / "nvme").string();
}
// 64 KiB chunks: the swap pipeline runs in many pieces even for gpt2-tiny.
nlohmann::json small_aio() {
  return {{"aio", {{"block_size", 65536}, {"queue_depth", 4}}}};
}

// ZeRO-Infinity on GPUs: with the optimizer states in an NVMe swap file (a temporary folder here;
// 64 KiB chunks, so the swap pipeline runs in many pieces) the host optimizer does the arithmetic it
// does on states in host memory, so the losses are those bit for bit, at every stage and in fp32 and
// bf16; the start-up report names the swap. A save reads the swap file itself (no snapshot copy), and
// its checkpoint resumes with the states in host memory and in the swap again, continuing the
// uninterrupted run bit for bit.
TEST(CudaTrain, NvmeOptimizerOffloadTrainsBitForBitLikeHostMemory) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
#if !SHARDKIT_HAVE_LIBURING
  GTEST_SKIP() << "built without liburing: no NVMe offload";
#endif
  Workspace ws(world);
  const std::string dir = swap_folder(world, ws);
  const nlohmann::json to_nvme = {
      {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir}, {"pin_memory", true}}}};
  const nlohmann::json aio = small_aio();
  for (const std::string precision : {"fp32", "bf16"}) {
    for (int stage = 1; stage <= 3; ++stage) {
      const std::string name = precision + "-" + std::to_string(stage);
      const auto in_memory =
          train(world, options(ws.config(stage, precision, name + "-host", true), ws / "tokens.bin", 6, "cuda"));
      const Shown on_nvme = train_shown(world, options(ws.config(stage, precision, name + "-nvme", false, to_nvme, aio),
                                                       ws / "tokens.bin", 6, "cuda"));
      expect_close(on_nvme.records, in_memory, 0, 0.0, name + " swapped to NVMe");
      if (world.rank() == 0) {
        EXPECT_NE(on_nvme.console.find("(on NVMe)"), std::string::npos) << name << ":\n" << on_nvme.console;
        EXPECT_NE(on_nvme.console.find("optimizer states swapped to " + dir), std::string::npos) << name << ":\n"
                                                                                                 << on_nvme.console;
      }
    }
  }
  TrainOptions full = options(ws.config(2, "bf16", "save-nvme", false, to_nvme, aio), ws / "tokens.bin", 8, "cuda");
  full.save_dir = ws / "from-nvme";
  full.save_interval = 3;
  const auto uninterrupted = train(world, full);
  TrainOptions to_host = options(ws.config(3, "bf16", "resume-host", true), ws / "tokens.bin", 8, "cuda");
  to_host.resume = (full.save_dir / "step-00000003").string();
  expect_close(train(world, to_host), uninterrupted, 3, 0.0, "NVMe checkpoint resumed in host memory at stage 3");
  TrainOptions again = options(ws.config(2, "bf16", "resume-nvme", false, to_nvme, aio), ws / "tokens.bin", 8, "cuda");
  again.resume = (full.save_dir / "step-00000006").string();
  expect_close(train(world, again), uninterrupted, 6, 0.0, "NVMe checkpoint resumed into the swap");
}

// ZeRO-Infinity's parameter offload: stage 3's partition in a swap file of its own (in the compute
// type, rounded into it by the host optimizer; every gather reads its slice of it) trains the losses of
// the partition in host memory bit for bit, with the optimizer's states in host memory and in their
// own swap, in fp32 and bf16, through gathers of several buckets a group. Its checkpoint resumes with
// the parameters in host memory, and that one's into the swap again, continuing the uninterrupted
// run bit for bit.
TEST(CudaTrain, NvmeParameterOffloadTrainsBitForBitLikeHostMemory) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
#if !SHARDKIT_HAVE_LIBURING
  GTEST_SKIP() << "built without liburing: no NVMe offload";
#endif
  Workspace ws(world);
  const std::string dir = swap_folder(world, ws);
  const nlohmann::json aio = small_aio();
  const nlohmann::json params_to_host = {{"offload_param", {{"device", "cpu"}}}};
  const auto to_nvme = [&](bool optimizer_too) {
    nlohmann::json zero = {{"offload_param", {{"device", "nvme"}, {"nvme_path", dir}}}};
    if (optimizer_too) zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir}};
    return zero;
  };
  for (const std::string precision : {"fp32", "bf16"}) {
    const auto in_memory = train(world, options(ws.config(3, precision, precision + "-host", true, params_to_host),
                                                ws / "tokens.bin", 6, "cuda"));
    for (const bool optimizer_too : {false, true}) {
      const std::string name = precision + (optimizer_too ? "-both" : "-params");
      const Shown swapped = train_shown(world, options(ws.config(3, precision, name, true, to_nvme(optimizer_too), aio),
                                                       ws / "tokens.bin", 6, "cuda"));
      expect_close(swapped.records, in_memory, 0, 0.0, name + " swapped to NVMe");
      if (world.rank() == 0) {
        EXPECT_NE(swapped.console.find("parameters swapped to " + dir), std::string::npos) << name << ":\n"
                                                                                           << swapped.console;
      }
    }
  }
  TrainOptions full = options(ws.config(3, "bf16", "save", true, to_nvme(true), aio), ws / "tokens.bin", 8, "cuda");
  full.save_dir = ws / "from-nvme";
  full.save_interval = 3;
  const auto uninterrupted = train(world, full);
  TrainOptions to_host =
      options(ws.config(3, "bf16", "resume-host", true, params_to_host), ws / "tokens.bin", 8, "cuda");
  to_host.resume = (full.save_dir / "step-00000003").string();
  to_host.save_dir = ws / "from-host";
  to_host.save_interval = 5;
  expect_close(train(world, to_host), uninterrupted, 3, 0.0, "parameter swap's checkpoint resumed in host memory");
  TrainOptions again =
      options(ws.config(3, "bf16", "resume-nvme", true, to_nvme(false), aio), ws / "tokens.bin", 8, "cuda");
  again.resume = (to_host.save_dir / "step-00000005").string();
  expect_close(train(world, again), uninterrupted, 5, 0.0, "checkpoint resumed into the parameter swap");
}

// offload_param is for stage 3 only (the lower stages keep every parameter on each GPU), and to NVMe
// only with the optimizer offloaded too (which writes the swap); the optimizer needs a partition
// (stage 1-3) to offload: all refused before any GPU is used.
TEST(CudaTrain, OffloadSettingsTheBackendCannotHonourAreRefused) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const auto error_of = [&](int stage, const std::string& key, const std::string& device) -> std::string {
    nlohmann::json zero = {{key, {{"device", device}}}};
    if (device == "nvme") zero[key]["nvme_path"] = ws.path().string();
    try {
      train(world, options(ws.config(stage, "fp32", "refused" + std::to_string(stage) + key + device, false, zero),
                           ws / "tokens.bin", 2, "cuda"));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(error_of(2, "offload_param", "cpu"),
            "zero_optimization.offload_param needs ZeRO stage 3 (stage 2 keeps every parameter on each GPU)");
  EXPECT_EQ(error_of(2, "offload_param", "nvme"),
            "zero_optimization.offload_param needs ZeRO stage 3 (stage 2 keeps every parameter on each GPU)");
  EXPECT_NE(error_of(3, "offload_param", "nvme").find("offload_param device nvme needs offload_optimizer"),
            std::string::npos);
  EXPECT_EQ(error_of(0, "offload_optimizer", "nvme"),
            "zero_optimization.offload_optimizer device nvme needs ZeRO stage 1, 2 or 3 (stage 0 keeps no optimizer "
            "partition)");
}

TEST(CudaTrain, CheckpointsMoveBetweenGpuAndCpu) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  // Uninterrupted GPU run, saving at step 3.
  TrainOptions full = options(ws.config(2, "fp32", "g2"), ws / "tokens.bin", 8, "cuda");
  full.save_dir = ws / "gpu";
  full.save_interval = 3;
  const auto uninterrupted = train(world, full);
  // GPU checkpoint -> CPU ranks at stage 3.
  TrainOptions on_cpu = options(ws.config(3, "fp32", "c3"), ws / "tokens.bin", 8, "cpu");
  on_cpu.resume = (full.save_dir / "step-00000003").string();
  on_cpu.save_dir = ws / "cpu";
  on_cpu.save_interval = 5;
  expect_close(train(world, on_cpu), uninterrupted, 3, 1e-4, "GPU -> CPU");
  // CPU checkpoint (step 5) -> GPU at stage 1.
  TrainOptions back = options(ws.config(1, "fp32", "g1"), ws / "tokens.bin", 8, "cuda");
  back.resume = (on_cpu.save_dir / "step-00000005").string();
  expect_close(train(world, back), uninterrupted, 5, 1e-4, "CPU -> GPU");
}

TEST(CudaTrain, ResumesAcrossGpuCounts) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  // W GPUs (stage 3) -> 1 GPU (stage 0).
  TrainOptions full = options(ws.config(3, "fp32", "w3"), ws / "tokens.bin", 8, "cuda");
  full.save_dir = ws / "w";
  full.save_interval = 4;
  const auto uninterrupted = train(world, full);
  TrainOptions one = options(ws.config(0, "fp32", "one0"), ws / "tokens.bin", 8, "cuda");
  one.resume = (full.save_dir / "step-00000004").string();
  expect_close(testing::train_on_rank0(world, one), uninterrupted, 4, 1e-4, "W GPUs -> 1 GPU");
  // 1 GPU (stage 1) -> W GPUs (stage 2).
  TrainOptions single = options(ws.config(1, "fp32", "one1"), ws / "tokens.bin", 8, "cuda");
  single.save_dir = ws / "one";
  single.save_interval = 4;
  const auto reference = testing::train_on_rank0(world, single);
  TrainOptions wide = options(ws.config(2, "fp32", "w2"), ws / "tokens.bin", 8, "cuda");
  wide.resume = (single.save_dir / "step-00000004").string();
  expect_close(train(world, wide), reference, 4, 1e-4, "1 GPU -> W GPUs");
}

}  // namespace
}  // namespace shardkit
