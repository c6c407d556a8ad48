// The CPU backend: the family's fp32 CPU model over the ZeRO engine of zero_engine.hpp, on MPI ranks.
#include <algorithm>
#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "base/fault.hpp"
#include "base/host_memory.hpp"
#include "base/parallel_memory.hpp"
#include "base/text_format.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/ops.hpp"
#include "trainer/backend.hpp"
#include "trainer/live_snapshot.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {
namespace {

// NVMe offload (ZeRO-Infinity) of the optimizer states and of stage 3's parameters, or none.
// Offloading to the CPU changes nothing on CPU ranks.
nvme::SwapFactory nvme_swaps(const BackendOptions& o) {
  const ZeroConfig& z = o.config->zero;
  if (z.offload_param.device == OffloadDevice::kNvme && z.stage != 3) {
    fail(ErrorKind::kInvalidInput, "zero_optimization.offload_param device nvme needs ZeRO stage 3 (stage " +
                                       std::to_string(z.stage) + " keeps every parameter on every rank)");
  }
  return nvme::swap_factory(*o.config, false, sizeof(float), optimizer_of(o).num_states(), *o.comm, o.log);
}

// --model and the config decide what a rank allocates: a model larger than the machine must be refused
// with its figures before the allocation, not end in std::bad_alloc (or the out-of-memory killer)
// after it. Every rank of the node holds its share (eval checks its weights the same way).
// A run that would fit with activation checkpointing is told so.
void require_training_memory(const BackendOptions& o) {
  const ZeroConfig& z = o.config->zero;
  const MemoryReport held =
      ZeroEngine::planned_memory(o.model->table(), z, optimizer_of(o), o.comm->size(), o.comm->rank());
  const auto parts = [&](double activations) {
    return std::array<MemoryPart, 4>{{{"parameters", static_cast<double>(held.parameters)},
                                      {"gradients", static_cast<double>(held.gradients)},
                                      {"optimizer states", static_cast<double>(held.optimizer_states)},
                                      {"activations", activations}}};
  };
  const int node_ranks = o.comm->node_place().size;
  const model::ActivationPlan plan = activation_plan(o);
  model::ActivationPlan recomputed = plan;
  recomputed.checkpointing = true;
  const double recomputed_bytes = o.model->cpu_activation_bytes(recomputed);
  const std::string would_fit = !plan.checkpointing && fits_physical_memory(parts(recomputed_bytes), node_ranks)
                                    ? "--activation-checkpointing (activations " + format_bytes(recomputed_bytes) + ")"
                                    : "";
  require_physical_memory("model " + o.model->name() + " at ZeRO stage " + std::to_string(z.stage) + " on " +
                              std::to_string(o.comm->size()) + (o.comm->size() == 1 ? " rank" : " ranks") +
                              ": training with a micro-batch of " + std::to_string(o.micro_batch) + " x " +
                              std::to_string(o.seq_len) + " tokens",
                          parts(o.model->cpu_activation_bytes(plan)), node_ranks, would_fit);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : options_(o),
        model_(o.model->make_cpu_model(activation_plan(o))),
        engine_(o.model->table(), o.model->groups(), decay_flags(*o.model), o.config->zero, optimizer_of(o),
                comm_dtype(*o.config), *o.comm, nvme_swaps(o)),
        snapshot_(static_cast<size_t>(optimizer_of(o).num_states())) {}

  const ckpt::Layout& layout() const override { return engine_.layout(); }
  std::string describe() const override {
    std::string out = std::string("CPU, fp32, matrix products: ") + model::cpu::gemm_backend();
    if (const nvme::StateSwapper* swap = engine_.swapper()) out += "; optimizer states swapped to " + swap->where();
    if (const nvme::StateSwapper* swap = engine_.param_swapper()) out += "; parameters swapped to " + swap->where();
    return out;
  }
  MemoryReport memory() const override { return engine_.memory(); }
  int64_t activation_bytes() const override { return model_->activation_bytes(); }

  void initialize(const InitFn& init) override { engine_.initialize(init); }
  void initialize(const RandomInit& init) override {
    engine_.initialize([&](int t, int64_t offset, std::span<float> out) { init_values(init, t, offset, out); });
  }

  void load(const LoadFn& read) override {
    engine_.fill_states([&](std::span<const ckpt::Fragment> plan, std::span<const std::span<float>> states) {
      read(load_requests({plan.begin(), plan.end()}, states));
    });
  }

  void zero_grads() override { engine_.zero_grads(); }
  double forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                          model::PassTimes* times) override {
    return model_->forward_backward(engine_, inputs, targets, options_.micro_batch, options_.seq_len, grad_scale,
                                    times);
  }
  void reduce_grads() override { engine_.reduce_grads(); }
  double global_grad_sq() override { return engine_.global_grad_sq(); }
  void step(const OptimizerStep& s) override {
    if (!copies_) snapshot_gate_.wait_open();  // a save may be reading the live states
    engine_.step(s);
  }
  const Optimizer& optimizer() const override { return optimizer_of(options_); }

  // A copy of the states in host memory where there is room (SnapshotStaging); otherwise, and always
  // for states swapped to NVMe (too large to be held twice), the save reads them where they live.
  void reserve_snapshot() override {
    if (decided_) return;
    decided_ = true;
    if (swapped()) {
      note_swapped_snapshots(options_);
      copies_ = false;
      return;
    }
    const int64_t bytes = optimizer().state_bytes() * engine_.layout().flat_size();
    copies_ = snapshot_copies_states(options_, bytes);
    if (!copies_) return;
    for (auto& buffer : snapshot_) buffer.resize(static_cast<size_t>(engine_.layout().flat_size()));
  }
  void begin_snapshot() override {
    reserve_snapshot();
    if (!copies_) {
      snapshot_gate_.close();
      return;
    }
    if (fault_armed("slow-snapshot")) {
      fault_delay();
    }
    for (size_t s = 0; s < snapshot_.size(); ++s) {
      float* out = snapshot_[s].data();
      engine_.read_state(static_cast<int>(s), [&](std::span<const float> piece) {
        parallel_copy(out, piece.data(), static_cast<int64_t>(piece.size()));
        out += piece.size();
      });
    }
  }
  void wait_snapshot() override {}
  // Without a copy: how long the optimizer step waited for the save to be done with the states.
  double snapshot_wait_ms() override { return copies_ ? 0 : snapshot_gate_.waited_ms(); }
  std::vector<std::span<const float>> snapshot_buffers() const override { return {snapshot_.begin(), snapshot_.end()}; }
  void stream_snapshot(int state, const std::function<void(std::span<const float>)>& sink) override {
    if (copies_) return Backend::stream_snapshot(state, sink);
    // The slow-snapshot fault delays the save's reading of the live states, which the step waits for.
    if (state == 0 && fault_armed("slow-snapshot")) {
      fault_delay();
    }
    engine_.read_state(state, sink);
  }
  void end_snapshot() override {
    if (!copies_) snapshot_gate_.open();
  }

 private:
  bool swapped() const noexcept { return engine_.swapper() != nullptr; }

  BackendOptions options_;
  std::unique_ptr<model::CpuModel> model_;
  ZeroEngine engine_;
  std::vector<LargeVector<float>> snapshot_;  // one per state of the optimizer
  bool decided_ = false;                      // reserve_snapshot() has chosen
  bool copies_ = true;  // snapshots are a copy; else the save reads the live states behind the gate
  SnapshotGate snapshot_gate_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  require_training_memory(options);
  return std::make_unique<CpuBackend>(options);
}

}  // namespace shardkit::trainer
