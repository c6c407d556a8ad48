// The CPU backend: the family's fp32 CPU model over the ZeRO engine of zero_engine.hpp, on MPI ranks.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "ckpt/fault.hpp"
#include "model/cpu/gemm.hpp"
#include "trainer/backend.hpp"
#include "trainer/weight_decay.hpp"

namespace shardkit::trainer {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : options_(o),
        model_(o.model->make_cpu_model(o.micro_batch, o.seq_len)),
        engine_(o.model->table(), o.model->groups(), decay_flags(*o.model), o.config->zero, comm_dtype(*o.config),
                *o.comm) {}

  const ckpt::Layout& layout() const override { return engine_.layout(); }
  std::string describe() const override {
    return std::string("CPU, fp32, matrix products: ") + model::cpu::gemm_backend();
  }
  MemoryReport memory() const override { return engine_.memory(); }
  int64_t activation_bytes() const override { return model_->activation_bytes(); }

  void initialize(const InitFn& init) override { engine_.initialize(init); }

  void load(const LoadFn& read) override {
    const std::span<float> targets[3] = {engine_.load_master(), engine_.load_exp_avg(), engine_.load_exp_avg_sq()};
    read(load_requests(engine_.load_plan(), targets));
    engine_.finish_load();
  }

  void zero_grads() override { engine_.zero_grads(); }
  double forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale,
                          model::PassTimes* times) override {
    return model_->forward_backward(engine_, inputs, targets, options_.micro_batch, options_.seq_len, grad_scale,
                                    times);
  }
  void reduce_grads() override { engine_.reduce_grads(); }
  double global_grad_sq() override { return engine_.global_grad_sq(); }
  void step(const AdamWStep& s) override { engine_.step(s); }

  void reserve_snapshot() override {
    for (auto& buffer : snapshot_) buffer.resize(engine_.master_flat().size());
  }
  // A plain copy, done when begin_snapshot returns.
  void begin_snapshot() override {
    reserve_snapshot();
    if (ckpt::fault_armed("slow-snapshot")) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ckpt::fault_delay_ms()));
    }
    const std::span<const float> sources[3] = {engine_.master_flat(), engine_.exp_avg_flat(),
                                               engine_.exp_avg_sq_flat()};
    for (int s = 0; s < 3; ++s) std::ranges::copy(sources[s], snapshot_[s].begin());
  }
  void wait_snapshot() override {}
  double snapshot_wait_ms() override { return 0; }
  std::array<std::span<const float>, 3> snapshot_buffers() const override {
    return {snapshot_[0], snapshot_[1], snapshot_[2]};
  }

 private:
  BackendOptions options_;
  std::unique_ptr<model::CpuModel> model_;
  ZeroEngine engine_;
  ckpt::LargeVector<float> snapshot_[3];
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace shardkit::trainer
