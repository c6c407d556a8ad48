// `shardkit train`: the training loop on MPI ranks, built in a fixed order — config, model, ZeRO
// engine, optimizer schedule, data, checkpoints — then a short loop.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "trainer/backend.hpp"

namespace shardkit::trainer {

struct TrainOptions {
  std::filesystem::path config;         // DeepSpeed JSON
  std::string model;                    // preset, JSON model file or Hugging Face config.json
  int seq_len = 0;                      // tokens per sample; 0: the model's longest
  std::filesystem::path data;           // token file
  int64_t steps = 0;                    // total optimizer steps (a resumed run continues to this number)
  std::optional<double> lr;             // fills the config's "auto" learning rate (ds_config.hpp's AutoContext)
  std::optional<int64_t> warmup_steps;  // fills its "auto" warmup_num_steps
  std::filesystem::path save_dir;
  int64_t save_interval = 0;  // 0: save only at the end (when save_dir is set)
  int keep_last = 0;          // 0: keep every checkpoint
  SaveMode save_mode = SaveMode::kAsync;
  SnapshotStaging snapshot_staging = SnapshotStaging::kAuto;
  bool stop_on_save_error = false;  // a failed save ends the run (default: reported, training goes on)
  std::string resume = "auto";      // auto | none | PATH
  std::filesystem::path metrics;
  uint64_t seed = 1234;
  std::filesystem::path init_from;  // Hugging Face weights to start from (when not resuming)
  ComputeDevice device = ComputeDevice::kCpu;
  int threads = 0;  // compute threads per rank; 0: cores / ranks on this node
  // Recompute each block's forward pass in the backward pass, as the config's activation_checkpointing
  // section does (this turns it on without one).
  bool activation_checkpointing = false;
  bool quiet = false;  // no console lines (metrics and errors still written)
  // GPU runs: optimizer step N alone inside the CUDA profiler API's range (cudaProfilerStart/Stop), for
  // Nsight Systems' --capture-range=cudaProfilerApi and Nsight Compute's --profile-from-start off.
  int64_t profile_step = 0;  // 0: none
};

// One optimizer step as the metrics contract reports it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1;
  bool skipped = false;
  int64_t tokens = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  // Where the step's time went (wall_clock_breakdown): the micro-batches' forward and backward passes,
  // the gradient reduction with the overflow check, and the optimizer step.
  double forward_ms = 0;
  double backward_ms = 0;
  double reduce_ms = 0;
  double optimizer_ms = 0;
};

class Trainer {
 public:
  // Validates everything (config against the world size, model, data) before any work; errors are
  // Error(kInvalidInput) naming the file and the numbers.
  Trainer(comm::MpiCollective& comm, const TrainOptions& options);
  ~Trainer();

  // Trains to options.steps, saving as configured. Returns the records of the steps run (every rank).
  std::vector<StepRecord> run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace shardkit::trainer
