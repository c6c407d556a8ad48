#include "trainer/cuda/memory_plan.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/text_format.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/gpu_model.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::ActivationBytes;
using model::cuda::planned_activation_bytes;

namespace {

std::string bytes(int64_t b) {
  return format_bytes(static_cast<double>(b));
}

// The settings a refusal offers, in the order a user would try them: a smaller micro-batch (the
// largest that fits), activation checkpointing (a third more compute, where offload costs transfers),
// with its inputs in host memory where it does not fit alone, a higher stage, the optimizer's states
// in host memory, then stage 3 with the parameters there too.
struct Alternative {
  std::string what;
  ZeroConfig zero;
  model::ActivationPlan activations;
  bool smaller_batch = false;
  bool host_inputs = false;  // checkpointing's inputs moved to the host: offered where checkpointing alone fails
};

std::vector<Alternative> alternatives(const ZeroConfig& zero, const model::ActivationPlan& activations) {
  std::vector<Alternative> out;
  for (int b = activations.batch / 2; b >= 1; b /= 2) {
    model::ActivationPlan smaller = activations;
    smaller.batch = b;
    out.push_back({"train_micro_batch_size_per_gpu " + std::to_string(b), zero, smaller, true});
  }
  model::ActivationPlan recomputed = activations;
  recomputed.checkpointing = true;
  if (!activations.checkpointing) out.push_back({"--activation-checkpointing", zero, recomputed});
  if (!activations.inputs_on_host) {
    recomputed.inputs_on_host = true;
    out.push_back(
        {R"(the config's "activation_checkpointing": {"cpu_checkpointing": true})", zero, recomputed, false, true});
  }
  const auto add = [&](const std::string& what, const ZeroConfig& z) { out.push_back({what, z, activations}); };
  for (int stage = zero.stage + 1; stage <= 3; ++stage) {
    ZeroConfig z = zero;
    z.stage = stage;
    add("zero_optimization.stage " + std::to_string(stage), z);
  }
  if (zero.offload_optimizer.device == OffloadDevice::kNone) {
    ZeroConfig z = zero;
    z.stage = std::max(zero.stage, 1);
    z.offload_optimizer.device = OffloadDevice::kCpu;
    add("offload_optimizer cpu" + std::string(zero.stage == 0 ? " at stage 1" : ""), z);
  }
  if (zero.offload_param.device != OffloadDevice::kCpu) {
    ZeroConfig z = zero;
    z.stage = 3;
    if (z.offload_optimizer.device == OffloadDevice::kNone) z.offload_optimizer.device = OffloadDevice::kCpu;
    z.offload_param.device = OffloadDevice::kCpu;
    add("stage 3 with offload_optimizer " + std::string(offload_device_name(z.offload_optimizer.device)) +
            " and offload_param cpu",
        z);
  }
  // Where host memory is what is short: the states in swap files on a local NVMe drive.
  if (zero.offload_optimizer.device != OffloadDevice::kNvme) {
    ZeroConfig z = zero;
    z.stage = std::max(zero.stage, 1);
    z.offload_optimizer.device = OffloadDevice::kNvme;
    add("offload_optimizer nvme (with its nvme_path)" + std::string(zero.stage == 0 ? " at stage 1" : ""), z);
    if (z.offload_param.device != OffloadDevice::kCpu) {
      z.stage = 3;
      z.offload_param.device = OffloadDevice::kCpu;
      add("stage 3 with offload_optimizer nvme and offload_param cpu", z);
    }
  }
  return out;
}

bool fits(const MemoryPlan& plan, const MemoryLimits& limits) {
  return plan.device() <= limits.device_free &&
         static_cast<double>(plan.host()) * limits.node_ranks <= limits.host_available;
}

}  // namespace

template <typename T>
MemoryPlan plan_memory(const model::Model& model, const ZeroConfig& zero, const RunShape& run, int world, int rank) {
  MemoryPlan plan;
  plan.engine = engine_footprint<T>(ZeroPlan(model.table(), world, rank, zero.stage), model.groups(), zero,
                                    optimizer(run.optimizer), run.wire, run.accumulation > 1);
  const ActivationBytes activations = planned_activation_bytes<T>(model, run.activations);
  plan.activations = activations.device;
  plan.activations_host = activations.host;
  return plan;
}

template <typename T>
std::string memory_refusal(const model::Model& model, const ZeroConfig& zero, const RunShape& run, int world, int rank,
                           const MemoryLimits& limits) {
  const MemoryPlan plan = plan_memory<T>(model, zero, run, world, rank);
  if (fits(plan, limits)) return "";
  std::vector<std::string> fitting;
  bool batch_found = false, checkpointing_found = false;
  for (const Alternative& a : alternatives(zero, run.activations)) {
    if ((a.smaller_batch && batch_found) || (a.host_inputs && checkpointing_found)) continue;
    RunShape shape = run;
    shape.activations = a.activations;
    const MemoryPlan p = plan_memory<T>(model, a.zero, shape, world, rank);
    if (!fits(p, limits)) continue;
    fitting.push_back(a.what + " (GPU " + bytes(p.device()) + ", host " + bytes(p.host()) + ")");
    batch_found = batch_found || a.smaller_batch;
    checkpointing_found = checkpointing_found || a.activations.checkpointing != run.activations.checkpointing;
    if (fitting.size() == 3) break;
  }
  std::string advice = "; ";
  if (fitting.empty()) {
    advice += "no smaller micro-batch, activation checkpointing, higher stage or offload fits: use more GPUs";
  } else {
    advice += "would fit: ";
    for (size_t i = 0; i < fitting.size(); ++i) advice += (i > 0 ? "; or " : "") + fitting[i];
  }
  const EngineFootprint& e = plan.engine;
  const std::string what = "model " + model.name() + " at ZeRO stage " + std::to_string(zero.stage) + ", micro-batch " +
                           std::to_string(run.activations.batch) + " x " + std::to_string(run.activations.seq_len) +
                           (run.activations.checkpointing ? " with activation checkpointing" : "") + " on " +
                           std::to_string(world) + " GPU(s) needs ";
  if (plan.device() > limits.device_free) {
    return what + bytes(plan.device()) + " of GPU memory per rank (parameters " + bytes(e.held.parameters) +
           ", gradients " + bytes(e.held.gradients) + ", optimizer states " + bytes(e.held.optimizer_states) +
           ", working buffers " + bytes(e.working) + ", activations " + bytes(plan.activations) + "), more than the " +
           bytes(limits.device_free) + " free on " + limits.device + advice;
  }
  return what + bytes(plan.host()) + " of host memory per rank (" + std::to_string(limits.node_ranks) +
         " rank(s) on this node), more than the " + format_bytes(limits.host_available) + " available (" +
         kHostMemoryVariable + " overrides what the kernel says)" + advice;
}

template <typename T>
MemoryPlan check_memory_plan(const model::Model& model, const ZeroConfig& zero, const RunShape& run,
                             comm::MpiCollective& comm, const DeviceContext& context,
                             const std::function<void(const std::string&)>& log) {
  const int world = comm.size(), rank = comm.rank();
  MemoryPlan plan = plan_memory<T>(model, zero, run, world, rank);
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  plan.free_before = static_cast<int64_t>(free);
  const EngineFootprint& e = plan.engine;
  std::string line = "memory plan per rank: " + describe_memory(e.held, plan.activations);
  if (e.working > 0) line += ", working buffers " + bytes(e.working);
  line += "; GPU " + bytes(plan.device()) + " of " + bytes(static_cast<int64_t>(free)) + " free";
  if (plan.host() > 0) line += "; host " + bytes(plan.host()) + ", of which page-locked " + bytes(plan.pinned_host());
  if (plan.activations_host > 0) line += " (block inputs " + bytes(plan.activations_host) + ")";
  log(line);
  const MemoryLimits limits{static_cast<int64_t>(free), available_memory_bytes(), comm.node_place().size,
                            "CUDA device " + std::to_string(context.device()) + " (" + context.props().name + ")"};
  const std::string refusal = memory_refusal<T>(model, zero, run, world, rank, limits);
  if (!refusal.empty()) fail(ErrorKind::kIo, refusal);
  return plan;
}

#define SHARDKIT_INSTANTIATE(T)                                                                             \
  template MemoryPlan plan_memory<T>(const model::Model&, const ZeroConfig&, const RunShape&, int, int);    \
  template std::string memory_refusal<T>(const model::Model&, const ZeroConfig&, const RunShape&, int, int, \
                                         const MemoryLimits&);                                              \
  template MemoryPlan check_memory_plan<T>(const model::Model&, const ZeroConfig&, const RunShape&,         \
                                           comm::MpiCollective&, const DeviceContext&,                      \
                                           const std::function<void(const std::string&)>&);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)
#undef SHARDKIT_INSTANTIATE

}  // namespace shardkit::trainer::cuda
