// ZeRO-Offload's optimizer side: the rank's fp32 master weights and AdamW moments in host memory, the
// update on the CPU (trainer/adamw.hpp: all threads, vectorised), pipelined with the transfers:
// gradients come down chunk by chunk, and each chunk's updated weights (already rounded to T) go up
// while the CPU works on the next chunk. Only the transfer staging buffers are page-locked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trainer/adamw.hpp"
#include "trainer/cuda/cuda_common.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
class HostOptimizer {
 public:
  explicit HostOptimizer(size_t count);

  std::span<float> master() noexcept { return master_; }
  std::span<float> exp_avg() noexcept { return exp_avg_; }
  std::span<float> exp_avg_sq() noexcept { return exp_avg_sq_; }
  int64_t state_bytes() const noexcept { return static_cast<int64_t>(3 * master_.size() * sizeof(float)); }

  // params (device, count elements) = the master weights in T; queued on `stream`, waited for here.
  void upload(T* params, cudaStream_t stream);

  // One AdamW step from the device gradients `grads` (count fp32, complete once `stream` reaches this
  // point); the updated weights land in `params` (device) in T, queued on `stream`.
  void step(const float* grads, T* params, const AdamWCoefficients& c, cudaStream_t stream);

 private:
  // The master weights of [lo, lo + len) in T, into the staging buffer (all threads).
  void narrow(int64_t lo, int64_t len);

  std::vector<float> master_, exp_avg_, exp_avg_sq_;
  PinnedBuffer<float> grad_staging_;
  PinnedBuffer<T> param_staging_;
  std::vector<Event> chunk_ready_;  // one per chunk: its gradients have reached the host
  Event uploaded_;
};

}  // namespace shardkit::trainer::cuda
