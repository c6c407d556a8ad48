// The CPU backend: the family's fp32 CPU model over the ZeRO engine of zero_engine.hpp, on MPI ranks.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/error.hpp"
#include "ckpt/fault.hpp"
#include "model/cpu/gemm.hpp"
#include "trainer/backend.hpp"
#include "trainer/nvme/swap_config.hpp"
#include "trainer/nvme/swap_file.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {
namespace {

// NVMe offload of the optimizer states (ZeRO-Infinity), or none. Offloading to the CPU changes
// nothing on CPU ranks; parameters stay in memory.
ZeroEngine::SwapFactory optimizer_swap(const BackendOptions& o) {
  const ZeroConfig& z = o.config->zero;
  if (z.offload_param.device == "nvme") {
    fail(ErrorKind::kInvalidInput,
         "zero_optimization.offload_param device nvme: parameter offload to NVMe is not implemented (offload_optimizer "
         "device nvme swaps the optimizer states)");
  }
  if (z.offload_optimizer.device != "nvme") return {};
  std::vector<std::string> notes;
  const nvme::SwapOptions options = nvme::optimizer_swap_options(*o.config, notes);
  for (const std::string& line : notes) o.log(line);
  comm::MpiCollective& comm = *o.comm;
  const auto log = o.log;
  return [options, &comm, log](int64_t elements) {
    return std::make_unique<nvme::StateSwapper>(options, nvme::rank_swap_name(comm, "optimizer"), elements, log);
  };
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : options_(o),
        model_(o.model->make_cpu_model(o.micro_batch, o.seq_len)),
        engine_(o.model->table(), o.model->groups(), decay_flags(*o.model), o.config->zero, comm_dtype(*o.config),
                *o.comm, optimizer_swap(o)) {}

  const ckpt::Layout& layout() const override { return engine_.layout(); }
  std::string describe() const override {
    std::string out = std::string("CPU, fp32, matrix products: ") + model::cpu::gemm_backend();
    if (const nvme::StateSwapper* swap = engine_.swapper()) {
      out +=
          "; optimizer states swapped to " + swap->path().string() + (swap->direct() ? " (O_DIRECT)" : " (buffered)");
    }
    return out;
  }
  MemoryReport memory() const override { return engine_.memory(); }
  int64_t activation_bytes() const override { return model_->activation_bytes(); }

  void initialize(const InitFn& init) override { engine_.initialize(init); }

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
  void step(const AdamWStep& s) override {
    if (swapped()) {
      // The save streams the states from the swap file: they may not change under it.
      std::unique_lock lock(snapshot_mutex_);
      if (snapshot_in_use_) {
        const auto start = std::chrono::steady_clock::now();
        snapshot_done_.wait(lock, [this] { return !snapshot_in_use_; });
        snapshot_wait_ms_ +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      }
    }
    engine_.step(s);
  }

  // Swapped states are streamed from the swap file by the save (they are too large to be held twice);
  // otherwise a plain copy, done when begin_snapshot returns.
  void reserve_snapshot() override {
    if (swapped()) return;
    for (auto& buffer : snapshot_) buffer.resize(static_cast<size_t>(engine_.layout().flat_size()));
  }
  void begin_snapshot() override {
    if (swapped()) {
      const std::lock_guard lock(snapshot_mutex_);
      snapshot_in_use_ = true;
      snapshot_wait_ms_ = 0;
      return;
    }
    reserve_snapshot();
    if (ckpt::fault_armed("slow-snapshot")) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ckpt::fault_delay_ms()));
    }
    for (int s = 0; s < 3; ++s) {
      float* out = snapshot_[s].data();
      engine_.read_state(s, [&](std::span<const float> piece) { out = std::ranges::copy(piece, out).out; });
    }
  }
  void wait_snapshot() override {}
  // Swapped: how long the optimizer step waited for the save to finish streaming the states.
  double snapshot_wait_ms() override {
    const std::lock_guard lock(snapshot_mutex_);
    return snapshot_wait_ms_;
  }
  std::array<std::span<const float>, 3> snapshot_buffers() const override {
    return {snapshot_[0], snapshot_[1], snapshot_[2]};
  }
  void stream_snapshot(int state, const std::function<void(std::span<const float>)>& sink) override {
    if (!swapped()) return Backend::stream_snapshot(state, sink);
    engine_.read_state(state, sink);
  }
  void end_snapshot() override {
    if (!swapped()) return;
    {
      const std::lock_guard lock(snapshot_mutex_);
      snapshot_in_use_ = false;
    }
    snapshot_done_.notify_all();
  }

 private:
  bool swapped() const noexcept { return engine_.swapper() != nullptr; }

  BackendOptions options_;
  std::unique_ptr<model::CpuModel> model_;
  ZeroEngine engine_;
  ckpt::LargeVector<float> snapshot_[3];
  std::mutex snapshot_mutex_;
  std::condition_variable snapshot_done_;
  bool snapshot_in_use_ = false;
  double snapshot_wait_ms_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace shardkit::trainer
