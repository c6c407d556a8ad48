// The CUDA backend: one GPU per MPI rank (the node-local rank picks the device), NCCL communicators
// bootstrapped over MPI, the family's GPU model (gpu_model.hpp) over the ZeRO engine of gpu_engine.hpp. The
// compute type follows the config: bf16, fp16, or fp32 when neither is enabled.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "base/fault.hpp"
#include "base/text_format.hpp"
#include "model/cuda/device_type.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/kernels.hpp"
#include "trainer/cuda/device_context.hpp"
#include "trainer/cuda/gpu_engine.hpp"
#include "trainer/cuda/memory_plan.hpp"
#include "trainer/live_snapshot.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {
namespace cuda {

using model::cuda::DeviceBuffer;
using model::cuda::DeviceType;
using model::cuda::GpuModel;
using model::cuda::Graph;
using model::cuda::make_gpu_model;
using model::cuda::PinnedBuffer;

namespace {

template <typename T>
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& o)
      : options_(o),
        context_(*o.comm),
        plan_(check_memory_plan<T>(*o.model, o.config->zero,
                                   RunShape{activation_plan(o), static_cast<int>(o.config->gradient_accumulation_steps),
                                            comm_dtype(*o.config), o.config->optimizer.kind},
                                   *o.comm, context_, o.log)),
        model_(make_gpu_model<T>(*o.model, activation_plan(o), context_.cublas(), context_.stream())),
        engine_(o.model->table(), o.model->groups(), decay_flags(*o.model), o.config->zero, optimizer_of(o),
                comm_dtype(*o.config), *o.comm, context_.nccl(), context_.stream(),
                nvme::swap_factory(*o.config, true, sizeof(T), optimizer_of(o).num_states(), *o.comm, o.log)),
        inputs_(static_cast<size_t>(o.micro_batch) * o.seq_len),
        targets_(static_cast<size_t>(o.micro_batch) * o.seq_len),
        snapshot_(static_cast<size_t>(optimizer_of(o).num_states())),
        replay_(engine_.fixed_buffers() && !o.config->wall_clock_breakdown) {}

  const ckpt::Layout& layout() const override { return engine_.layout(); }
  std::string describe() const override {
    int nccl = 0;
    ncclGetVersion(&nccl);
    std::string out = "CUDA device " + std::to_string(context_.device()) + " (" + context_.props().name + "), " +
                      DeviceType<T>::kName + " compute with fp32 master weights, cuBLAS, NCCL " + std::to_string(nccl);
    if (const nvme::StateSwapper* swap = engine_.swapper()) out += "; optimizer states swapped to " + swap->where();
    if (const nvme::StateSwapper* swap = engine_.param_swapper()) out += "; parameters swapped to " + swap->where();
    return out;
  }
  MemoryReport memory() const override { return engine_.memory(); }
  int64_t activation_bytes() const override { return model_->activation_bytes(); }
  DeviceUse device_use() const override {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return {plan_.device() + static_cast<int64_t>(engine_.memory().snapshot_staging),
            plan_.free_before - static_cast<int64_t>(free)};
  }

  void initialize(const InitFn& init) override { engine_.initialize(init); }
  void initialize(const RandomInit& init) override { engine_.initialize(init); }
  void load(const LoadFn& read) override { engine_.load(read); }
  void zero_grads() override { engine_.zero_grads(); }

  double forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                          model::PassTimes* times) override {
    const size_t bytes = inputs_.bytes();
    CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), inputs, bytes, cudaMemcpyHostToDevice, context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(targets_.data(), targets, bytes, cudaMemcpyHostToDevice, context_.stream()));
    // Stages 0-1 without wall_clock_breakdown (which times the forward and backward passes apart)
    // replay the passes as a CUDA graph: the same kernels on the same memory, without their launch
    // gaps (about 1 % of a GPT-2 124M step on an H200). The first micro-batch runs kernel by kernel,
    // building the matrix products' plans and workspaces (which a capture cannot allocate); the graph
    // is captured again whenever the loss scale, a kernel argument, changes. A step's first micro-batch
    // stores its gradients and later ones add to them (GpuParamStore::grads_fresh): a graph for each.
    if (!replay_ || !warm_) {
      warm_ = true;
      return model_->forward_backward(engine_, inputs_.data(), targets_.data(), grad_scale, times);
    }
    Replay& replay = replays_[engine_.grads_fresh(0) ? 1 : 0];
    if (!replay.graph.ready() || replay.scale != grad_scale) {
      replay.graph.capture(context_.stream(),
                           [&] { model_->queue(engine_, inputs_.data(), targets_.data(), grad_scale, nullptr); });
      replay.scale = grad_scale;
    }
    replay.graph.launch(context_.stream());
    engine_.pass_done();
    return model_->finish(engine_, nullptr);
  }
  void reduce_grads() override { engine_.reduce_grads(); }
  double global_grad_sq() override { return engine_.global_grad_sq(); }
  void step(const OptimizerStep& s) override {
    if (!copies_) snapshot_gate_.wait_open();  // a save may be reading the offloaded states
    engine_.step(s);
  }
  const Optimizer& optimizer() const override { return optimizer_of(options_); }
  void reserve_snapshot() override {
    if (decided_) return;
    decided_ = true;
    const int64_t flat = engine_.layout().flat_size();
    if (engine_.swapper() != nullptr) {
      note_swapped_snapshots(options_);
      copies_ = false;
      return;
    }
    if (engine_.offloaded()) {
      if (options_.snapshot_staging == SnapshotStaging::kDevice) {
        fail(ErrorKind::kInvalidInput,
             "--snapshot-staging device: the optimizer states are offloaded to host memory (offload_optimizer), "
             "where a save copies them from directly");
      }
      copies_ = snapshot_copies_states(options_, optimizer().state_bytes() * flat);
    } else if (options_.snapshot_staging == SnapshotStaging::kNone) {
      fail(ErrorKind::kInvalidInput,
           "--snapshot-staging none: the optimizer states are in GPU memory, and a save copies them to host memory "
           "(device or host); none is for states in host memory (offload_optimizer)");
    }
    if (!copies_) return;
    for (auto& b : snapshot_) b.resize(static_cast<size_t>(flat));  // page-locked
    if (!engine_.offloaded()) reserve_staging();
  }
  void begin_snapshot() override {
    reserve_snapshot();
    if (!copies_) {
      snapshot_gate_.close();
      return;
    }
    std::vector<std::span<float>> targets;
    for (PinnedBuffer<float>& b : snapshot_) targets.emplace_back(b.data(), b.size());
    engine_.begin_snapshot(targets);
  }
  void wait_snapshot() override {
    if (copies_) engine_.wait_snapshot();
  }
  double snapshot_wait_ms() override { return copies_ ? engine_.snapshot_wait_ms() : snapshot_gate_.waited_ms(); }
  std::vector<std::span<const float>> snapshot_buffers() const override {
    std::vector<std::span<const float>> out;
    for (const PinnedBuffer<float>& b : snapshot_) out.emplace_back(b.data(), b.size());
    return out;
  }
  void stream_snapshot(int state, const std::function<void(std::span<const float>)>& sink) override {
    if (copies_) return Backend::stream_snapshot(state, sink);
    if (state == 0 && fault_armed("slow-snapshot")) {  // delays the save's read, which the step waits for
      fault_delay();
    }
    engine_.read_offloaded(state, sink);
  }
  void end_snapshot() override {
    if (!copies_) snapshot_gate_.open();
  }
  void profiler_range(bool open) override {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(open ? cudaProfilerStart() : cudaProfilerStop());
  }

 private:
  // States in GPU memory: decides where snapshots go first (SnapshotStaging), allocates the staging
  // copy if there, and says which.
  void reserve_staging() {
    const SnapshotStaging mode = options_.snapshot_staging;
    const auto bytes = [](int64_t b) { return format_bytes(static_cast<double>(b)); };
    const std::string direct = "checkpoint snapshots: copied from GPU to host memory directly";
    if (mode == SnapshotStaging::kHost) {
      log(direct + " (--snapshot-staging host)");
      return;
    }
    const int64_t need = engine_.staging_bytes();
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    // What the run still allocates after start-up (the matrix products' workspaces and plans, NCCL's
    // buffers, the captured graph) needs room beside the staging copy.
    const int64_t headroom = std::max<int64_t>(int64_t{2} << 30, static_cast<int64_t>(total / 20));
    if (mode == SnapshotStaging::kAuto && need + headroom > static_cast<int64_t>(free)) {
      log(direct + ": a staging copy in GPU memory would take " + bytes(need) + " of the " +
          bytes(static_cast<int64_t>(free)) + " free (--snapshot-staging device forces it)");
      return;
    }
    try {
      engine_.reserve_staging();
    } catch (const Error& e) {
      throw Error(e.kind(),
                  std::string("--snapshot-staging device: the staging copy of the optimizer states: ") + e.what());
    }
    log("checkpoint snapshots: staged in GPU memory (" + bytes(need) +
        "), drained to host memory while training goes on");
  }
  void log(const std::string& line) const {
    if (options_.log) options_.log(line);
  }

  BackendOptions options_;
  DeviceContext context_;
  MemoryPlan plan_;  // checked before anything below is allocated
  std::unique_ptr<GpuModel<T>> model_;
  GpuZeroEngine<T> engine_;
  DeviceBuffer<int32_t> inputs_, targets_;
  std::vector<PinnedBuffer<float>> snapshot_;  // one per state of the optimizer (page-locked)
  bool decided_ = false;                       // reserve_snapshot() has chosen
  bool copies_ = true;  // snapshots are a copy; else (offloaded states) the save reads them behind the gate
  SnapshotGate snapshot_gate_;
  const bool replay_;  // the passes run as a captured graph
  bool warm_ = false;  // a micro-batch has run kernel by kernel
  struct Replay {
    Graph graph;
    float scale = 0.0f;  // the loss scale the graph was captured with
  };
  std::array<Replay, 2> replays_;  // adding to the step's gradients, and storing them (its first micro-batch)
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  model::cuda::require_gpu_kernels(*options.model);
  const ZeroConfig& z = options.config->zero;
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
    fail(ErrorKind::kInvalidInput, "zero_optimization.offload_optimizer device " +
                                       std::string(offload_device_name(z.offload_optimizer.device)) +
                                       " needs ZeRO stage 1, 2 or 3 (stage 0 keeps no optimizer partition)");
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    fail(ErrorKind::kInvalidInput, "zero_optimization.offload_param needs ZeRO stage 3 (stage " +
                                       std::to_string(z.stage) + " keeps every parameter on each GPU)");
  }
  // The swap holds copies of the master weights, which the host optimizer writes as it updates them.
  // With the optimizer on the GPU the parameters would be a seventh of what it keeps there.
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_optimizer.device == OffloadDevice::kNone) {
    fail(ErrorKind::kInvalidInput,
         "zero_optimization.offload_param device nvme needs offload_optimizer device \"cpu\" or \"nvme\" on "
         "GPUs (the optimizer's fp32 states on the GPU take six times the parameters' memory)");
  }
  if (options.config->bf16) return std::make_unique<cuda::CudaBackend<__nv_bfloat16>>(options);
  if (options.config->fp16.enabled) return std::make_unique<cuda::CudaBackend<__half>>(options);
  return std::make_unique<cuda::CudaBackend<float>>(options);
}

}  // namespace shardkit::trainer
