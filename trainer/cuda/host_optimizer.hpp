// ZeRO-Offload's optimizer side: the rank's fp32 master weights and AdamW moments in host memory, the
// update on the CPU (trainer/adamw.hpp: all threads, vectorised), pipelined with the transfers:
// gradients come down chunk by chunk, and each chunk's updated weights (already rounded to T) go up
// while the CPU works on the next chunk. Only the transfer staging buffers are page-locked. With
// offload_param the weights in T live in (page-locked) host memory themselves: the CPU writes them
// there directly, and nothing goes up.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/huge_pages.hpp"
#include "ckpt/shard_format.hpp"
#include "trainer/adamw.hpp"
#include "trainer/cuda/cuda_common.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
class HostOptimizer {
 public:
  // `count` elements of state. `params_on_host`: the weights in T that upload() and step() write are
  // in host memory (offload_param), else in device memory.
  HostOptimizer(size_t count, bool params_on_host);

  std::span<float> master() noexcept { return master_.span(); }
  std::span<float> exp_avg() noexcept { return exp_avg_.span(); }
  std::span<float> exp_avg_sq() noexcept { return exp_avg_sq_.span(); }
  int64_t state_bytes() const noexcept { return ckpt::kOptimizerStateBytes * static_cast<int64_t>(master_.size()); }
  // The page-locked transfer buffers an optimizer of `count` elements allocates.
  static int64_t pinned_bytes(size_t count, bool params_on_host) noexcept {
    return static_cast<int64_t>(count * (sizeof(float) + (params_on_host ? 0 : sizeof(T))));
  }

  // params (count elements) = the master weights in T, once the work queued on `stream` so far is
  // done (it may read them); complete on return.
  void upload(T* params, cudaStream_t stream);

  // One AdamW step from the device gradients `grads` (count fp32, complete once `stream` reaches this
  // point), without weight decay on the elements `no_decay` names (its table in host memory); the
  // updated weights land in `params` in T: in device memory queued on `stream`, in host memory on
  // return (written once `stream` has reached this point, so work queued before may read them).
  void step(const float* grads, T* params, const AdamWCoefficients& c, NoDecayRanges no_decay, cudaStream_t stream);

 private:
  // The master weights of [lo, lo + len) in T, into out[lo, lo + len) (host memory; all threads).
  void narrow(int64_t lo, int64_t len, T* out);
  // Where the CPU writes the weights in T: `params` themselves in host memory, else the staging buffer.
  T* host_weights(T* params) noexcept { return params_on_host_ ? params : param_staging_.data(); }

  bool params_on_host_;
  HugeBuffer<float> master_, exp_avg_, exp_avg_sq_;  // zero-filled on the compute threads
  PinnedBuffer<float> grad_staging_;
  PinnedBuffer<T> param_staging_;   // params in device memory: the weights in T on their way up
  std::vector<Event> chunk_ready_;  // one per chunk: its gradients have reached the host
  Event uploaded_;
};

}  // namespace shardkit::trainer::cuda
