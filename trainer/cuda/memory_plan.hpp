// The memory a rank will hold, computed from the model, the ZeRO settings and the micro-batch before
// anything is allocated: said at start-up, and a run that cannot fit is refused there, with the
// numbers and the settings that would fit, instead of at its first failing allocation minutes later.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/model.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/ds_config.hpp"

namespace shardkit::trainer::cuda {

struct MemoryPlan {
  EngineFootprint engine;        // the ZeRO engine's buffers: the fixed ones as memory() will report them
  int64_t activations = 0;       // the GPU model's, as activation_bytes() will report them
  int64_t activations_host = 0;  // the block inputs cpu_checkpointing keeps in page-locked host memory
  int64_t free_before = 0;       // device memory free when the plan was checked, before the backend allocated

  // Device memory of the above.
  int64_t device() const noexcept {
    return engine.held.parameters + engine.held.gradients + engine.held.optimizer_states + engine.working + activations;
  }
  // Page-locked host memory: transfer buffers and block inputs.
  int64_t pinned_host() const noexcept { return engine.pinned_host + activations_host; }
  // Host memory: the page-locked buffers and offloaded states.
  int64_t host() const noexcept { return pinned_host() + engine.held.host_optimizer_states; }
};

// How the run trains, beyond the ZeRO settings: what the plan depends on.
struct RunShape {
  model::ActivationPlan activations;                // micro-batch, sequence and activation checkpointing
  int accumulation = 1;                             // gradient_accumulation_steps
  ckpt::DType wire = ckpt::DType::kF32;             // communication_data_type, resolved
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // whose states the engine keeps
};

// What a plan must fit in: one GPU's free memory, and the host memory available to the node's ranks.
struct MemoryLimits {
  int64_t device_free = 0;
  double host_available = 0;
  int node_ranks = 1;
  std::string device;  // "CUDA device 0 (NVIDIA H200)", for the refusal
};

template <typename T>
MemoryPlan plan_memory(const model::Model& model, const ZeroConfig& zero, const RunShape& run, int world, int rank);

// The one-line refusal of a run whose plan exceeds `limits`, naming what the plan needs and the
// settings that would fit (a smaller micro-batch, activation checkpointing, a higher stage, offload);
// empty when the plan fits.
template <typename T>
std::string memory_refusal(const model::Model& model, const ZeroConfig& zero, const RunShape& run, int world, int rank,
                           const MemoryLimits& limits);

// This rank's plan, said through `log`; Error(kIo) when it exceeds the device's free memory or the
// node's available host memory (all ranks of the node together), naming what would fit. Collective
// (every rank of the job calls it).
template <typename T>
MemoryPlan check_memory_plan(const model::Model& model, const ZeroConfig& zero, const RunShape& run,
                             comm::MpiCollective& comm, const DeviceContext& context,
                             const std::function<void(const std::string&)>& log);

}  // namespace shardkit::trainer::cuda
