#include "trainer/cuda/memory_plan.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/text_format.hpp"
#include "trainer/cuda/gpu_model.hpp"

namespace shardkit::trainer::cuda {
namespace {

std::string bytes(int64_t b) {
  return format_bytes(static_cast<double>(b));
}

// The settings a refusal offers, in the order a user would try them: a smaller micro-batch (the
// largest that fits), a higher stage, the optimizer's states in host memory, then stage 3 with the
// parameters there too.
struct Alternative {
  std::string what;
  ZeroConfig zero;
  int micro_batch;
  bool smaller_batch = false;
};

std::vector<Alternative> alternatives(const ZeroConfig& zero, int micro_batch) {
  std::vector<Alternative> out;
  for (int b = micro_batch / 2; b >= 1; b /= 2) {
    out.push_back({"train_micro_batch_size_per_gpu " + std::to_string(b), zero, b, true});
  }
  for (int stage = zero.stage + 1; stage <= 3; ++stage) {
    ZeroConfig z = zero;
    z.stage = stage;
    out.push_back({"zero_optimization.stage " + std::to_string(stage), z, micro_batch});
  }
  if (zero.offload_optimizer.device == "none") {
    ZeroConfig z = zero;
    z.stage = std::max(zero.stage, 1);
    z.offload_optimizer.device = "cpu";
    out.push_back({"offload_optimizer cpu" + std::string(zero.stage == 0 ? " at stage 1" : ""), z, micro_batch});
  }
  if (zero.offload_param.device != "cpu") {
    ZeroConfig z = zero;
    z.stage = 3;
    if (z.offload_optimizer.device == "none") z.offload_optimizer.device = "cpu";
    z.offload_param.device = "cpu";
    out.push_back(
        {"stage 3 with offload_optimizer " + z.offload_optimizer.device + " and offload_param cpu", z, micro_batch});
  }
  // Where host memory is what is short: the states in swap files on a local NVMe drive.
  if (zero.offload_optimizer.device != "nvme") {
    ZeroConfig z = zero;
    z.stage = std::max(zero.stage, 1);
    z.offload_optimizer.device = "nvme";
    out.push_back({"offload_optimizer nvme (with its nvme_path)" + std::string(zero.stage == 0 ? " at stage 1" : ""), z,
                   micro_batch});
    if (z.offload_param.device != "cpu") {
      z.stage = 3;
      z.offload_param.device = "cpu";
      out.push_back({"stage 3 with offload_optimizer nvme and offload_param cpu", z, micro_batch});
    }
  }
  return out;
}

}  // namespace

template <typename T>
MemoryPlan plan_memory(const model::Model& model, const ZeroConfig& zero, const RunShape& run, int world, int rank) {
  MemoryPlan plan;
  plan.engine = engine_footprint<T>(ZeroPlan(model.table(), world, rank, zero.stage), model.groups(), zero, run.wire,
                                    run.accumulation > 1);
  plan.activations = planned_activation_bytes<T>(model, run.micro_batch, run.seq_len);
  return plan;
}

template <typename T>
MemoryPlan check_memory_plan(const model::Model& model, const ZeroConfig& zero, const RunShape& run,
                             comm::MpiCollective& comm, const DeviceContext& context,
                             const std::function<void(const std::string&)>& log) {
  const int world = comm.size(), rank = comm.rank();
  const int node_ranks = comm.node_place().size;
  const int micro_batch = run.micro_batch, seq_len = run.seq_len;
  MemoryPlan plan = plan_memory<T>(model, zero, run, world, rank);
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  plan.free_before = static_cast<int64_t>(free);
  const double host_free = available_memory_bytes();
  const auto fits = [&](const MemoryPlan& p) {
    return p.device() <= static_cast<int64_t>(free) && static_cast<double>(p.host()) * node_ranks <= host_free;
  };
  const EngineFootprint& e = plan.engine;
  std::string line = "memory plan per rank: " + describe_memory(e.held, plan.activations);
  if (e.working > 0) line += ", working buffers " + bytes(e.working);
  line += "; GPU " + bytes(plan.device()) + " of " + bytes(static_cast<int64_t>(free)) + " free";
  if (plan.host() > 0) line += "; host " + bytes(plan.host()) + ", of which page-locked " + bytes(e.pinned_host);
  log(line);
  if (fits(plan)) return plan;

  std::vector<std::string> fitting;
  bool batch_found = false;
  for (const Alternative& a : alternatives(zero, micro_batch)) {
    if (a.smaller_batch && batch_found) continue;
    RunShape shape = run;
    shape.micro_batch = a.micro_batch;
    const MemoryPlan p = plan_memory<T>(model, a.zero, shape, world, rank);
    if (!fits(p)) continue;
    fitting.push_back(a.what + " (GPU " + bytes(p.device()) + ", host " + bytes(p.host()) + ")");
    batch_found = batch_found || a.smaller_batch;
    if (fitting.size() == 3) break;
  }
  std::string advice = "; ";
  if (fitting.empty()) {
    advice += "no smaller micro-batch, higher stage or offload fits: use more GPUs";
  } else {
    advice += "would fit: ";
    for (size_t i = 0; i < fitting.size(); ++i) advice += (i > 0 ? "; or " : "") + fitting[i];
  }
  const std::string what = "model " + model.name() + " at ZeRO stage " + std::to_string(zero.stage) + ", micro-batch " +
                           std::to_string(micro_batch) + " x " + std::to_string(seq_len) + " on " +
                           std::to_string(world) + " GPU(s) needs ";
  if (plan.device() > static_cast<int64_t>(free)) {
    fail(ErrorKind::kIo, what + bytes(plan.device()) + " of GPU memory per rank (parameters " +
                             bytes(e.held.parameters) + ", gradients " + bytes(e.held.gradients) +
                             ", optimizer states " + bytes(e.held.optimizer_states) + ", working buffers " +
                             bytes(e.working) + ", activations " + bytes(plan.activations) + "), more than the " +
                             bytes(static_cast<int64_t>(free)) + " free on CUDA device " +
                             std::to_string(context.device()) + " (" + context.props().name + ")" + advice);
  }
  fail(ErrorKind::kIo, what + bytes(plan.host()) + " of host memory per rank (" + std::to_string(node_ranks) +
                           " rank(s) on this node), more than the " + format_bytes(host_free) + " available (" +
                           kHostMemoryVariable + " overrides what the kernel says)" + advice);
}

#define SHARDKIT_INSTANTIATE(T)                                                                          \
  template MemoryPlan plan_memory<T>(const model::Model&, const ZeroConfig&, const RunShape&, int, int); \
  template MemoryPlan check_memory_plan<T>(const model::Model&, const ZeroConfig&, const RunShape&,      \
                                           comm::MpiCollective&, const DeviceContext&,                   \
                                           const std::function<void(const std::string&)>&);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)
#undef SHARDKIT_INSTANTIATE

}  // namespace shardkit::trainer::cuda
