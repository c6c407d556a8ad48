// The device side of training: where parameters, gradients and optimizer states live, and how a
// micro-batch, the gradient reduction and the optimizer step run. The CPU backend (the family's CPU
// model + ZeroEngine on MPI) and the CUDA backend (kernels + NCCL) implement it; the training loop, the loss scaler,
// the schedule, checkpointing and metrics are shared.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/tensor_table.hpp"
#include "comm/mpi.hpp"
#include "model/model.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/init.hpp"
#include "trainer/zero_engine.hpp"

namespace shardkit::trainer {

// Where a rank's checkpoint snapshot goes (the train command's --snapshot-staging). kDevice (GPU
// ranks): a copy in device memory, drained to host memory beside the following steps. kHost: a copy in
// host memory (from a GPU, the next optimizer step waits for that copy). kNone (states in host memory:
// CPU ranks, or offloaded from a GPU): no copy; the save reads the live states and the next optimizer
// step waits until it is done with them. kAuto: the first of device, host and none that has room
// (NVMe-swapped states are always read where they live).
enum class SnapshotStaging { kAuto, kDevice, kHost, kNone };

// How a save runs (the train command's --save-mode).
enum class SaveMode {
  kAsync,  // snapshot, then write and commit on a background thread while training continues
  kSync,   // the training loop waits until the checkpoint is committed
};

// Where a rank computes (the train command's --device).
enum class ComputeDevice { kCpu, kCuda };

struct BackendOptions {
  const model::Model* model = nullptr;
  const DsConfig* config = nullptr;
  int micro_batch = 1;
  int seq_len = 1;
  comm::MpiCollective* comm = nullptr;
  SnapshotStaging snapshot_staging = SnapshotStaging::kAuto;
  std::function<void(const std::string&)> log;  // notices for the run's log (rank 0 prints them)
};

// The model's activations as the run asks for them: its micro-batch and sequence, and the config's
// activation checkpointing (the train command's flag is merged into it).
inline model::ActivationPlan activation_plan(const BackendOptions& o) {
  const ActivationCheckpointingConfig& a = o.config->activation_checkpointing;
  return {.batch = o.micro_batch,
          .seq_len = o.seq_len,
          .checkpointing = a.enabled,
          .inputs_on_host = a.enabled && a.cpu_checkpointing};
}

// Fills elements [offset, offset + out.size()) of a tensor (initialisation).
using InitFn = std::function<void(int tensor, int64_t offset, std::span<float> out)>;
// The run's optimizer (the config's optimizer.type).
inline const Optimizer& optimizer_of(const BackendOptions& o) {
  return optimizer(o.config->optimizer.kind);
}

// Fills the ranges of a checkpoint read, all at once (states in the optimizer's order: 0 = fp32 master).
using LoadFn = std::function<void(std::span<const ckpt::ReadRequest> requests)>;

// The reads that fill a rank's flat buffers of consecutive states from a checkpoint: `flats[i]` is
// state first_state + i, read with one request per fragment of `plan`. The elements no fragment
// covers (alignment padding) are set to zero here; the rest of each buffer may be uninitialised
// memory: the reads write it from the reader's threads, which also spreads the first touch of fresh
// pages over them.
inline std::vector<ckpt::ReadRequest> load_requests(std::vector<ckpt::Fragment> plan,
                                                    std::span<const std::span<float>> flats, int first_state = 0) {
  std::ranges::sort(plan, {}, &ckpt::Fragment::flat_offset);
  std::vector<ckpt::ReadRequest> requests;
  requests.reserve(plan.size() * flats.size());
  for (size_t i = 0; i < flats.size(); ++i) {
    const std::span<float> flat = flats[i];
    size_t covered = 0;
    for (const ckpt::Fragment& f : plan) {
      const auto begin = static_cast<size_t>(f.flat_offset);
      std::fill(flat.begin() + static_cast<std::ptrdiff_t>(covered), flat.begin() + static_cast<std::ptrdiff_t>(begin),
                0.0f);
      requests.push_back({f.tensor, first_state + static_cast<int>(i), f.tensor_offset,
                          flat.subspan(begin, static_cast<size_t>(f.length))});
      covered = begin + static_cast<size_t>(f.length);
    }
    std::fill(flat.begin() + static_cast<std::ptrdiff_t>(covered), flat.end(), 0.0f);
  }
  return requests;
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const ckpt::Layout& layout() const = 0;
  // One line for the start-up log: device, precision, matrix library.
  virtual std::string describe() const = 0;
  // Bytes this rank holds; `activations` the model's buffers for one micro-batch.
  virtual MemoryReport memory() const = 0;
  virtual int64_t activation_bytes() const = 0;
  // GPU ranks: the device memory the backend takes, measured now (what the device had free before the
  // backend allocated, less what it has free now: its buffers and what cuBLAS, NCCL and CUDA graphs
  // took for it), beside what its memory plan said. Zeros elsewhere.
  struct DeviceUse {
    int64_t planned = 0;
    int64_t measured = 0;
  };
  virtual DeviceUse device_use() const { return {}; }

  // Sets every parameter this rank keeps (moments zero): from `init` (weights read from a file), or
  // drawn where the states live (the same bits on every backend).
  virtual void initialize(const InitFn& init) = 0;
  virtual void initialize(const RandomInit& init) = 0;
  // Reads this rank's master weights and moments through `read`, whatever layout they came from.
  virtual void load(const LoadFn& read) = 0;

  // One optimizer step: zero_grads, forward_backward per micro-batch, reduce_grads, global_grad_sq,
  // then either step or (overflow) nothing.
  virtual void zero_grads() = 0;
  // Micro-batch of micro_batch x seq_len tokens; returns its mean loss and accumulates the gradient
  // of grad_scale * loss.
  virtual double forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                                  model::PassTimes* times) = 0;
  virtual void reduce_grads() = 0;
  // Sum over ranks of the squares of the (summed, still scaled) gradients, in double: non-finite
  // exactly when some gradient is (the loss scaler's overflow test).
  virtual double global_grad_sq() = 0;
  virtual void step(const OptimizerStep& step) = 0;
  // The optimizer whose states the backend keeps (its update is step()'s).
  virtual const Optimizer& optimizer() const = 0;

  // The snapshot of a save: the rank's states in the checkpoint layout (layout().flat_size() elements
  // each, in the optimizer's order) copied, between optimizer steps, into host buffers the backend
  // allocates once (page-locked on GPUs). begin_snapshot() starts the copy; the buffers may be read
  // once wait_snapshot() has returned (from any thread). Until the copy is done the backend's next
  // optimizer step does not change the states, so training may go on meanwhile.
  // reserve_snapshot() allocates the buffers ahead of the first save, which would otherwise stall
  // for it (pinning gigabytes takes seconds).
  virtual void reserve_snapshot() = 0;
  virtual void begin_snapshot() = 0;
  virtual void wait_snapshot() = 0;
  // The device time the last snapshot took from the training stream (ms; the device's clock): the
  // optimizer step's wait for a copy to host memory, or the copy into device staging memory. What a
  // save costs training beyond the time begin_snapshot() blocked the host. Called once the snapshot
  // is released (after wait_snapshot()); 0 where the copy is done when begin_snapshot() returns, or
  // when no optimizer step has had to wait for it.
  virtual double snapshot_wait_ms() = 0;
  virtual std::vector<std::span<const float>> snapshot_buffers() const = 0;
  // What the save writes: the optimizer's state `state` (0: master weights) handed to `sink` in flat
  // order, after wait_snapshot(). The snapshot buffer whole, unless the states are too large to be
  // held twice (NVMe offload): then they are streamed from where they live, and the backend's next
  // optimizer step waits for end_snapshot() instead of the copy.
  virtual void stream_snapshot(int state, const std::function<void(std::span<const float>)>& sink) {
    sink(snapshot_buffers()[static_cast<size_t>(state)]);
  }
  // The save is done with the snapshot (committed, failed or abandoned).
  virtual void end_snapshot() {}

  // GPU ranks: opens (or closes) the CUDA profiler API's collection range, once the work queued before
  // has run, so that the range holds what is queued in between and nothing else.
  virtual void profiler_range(bool open) { (void)open; }
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);
// Error(kInvalidInput) when this build has no CUDA or no GPU is visible.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace shardkit::trainer
