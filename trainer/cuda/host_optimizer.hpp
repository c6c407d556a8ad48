// ZeRO-Offload's optimizer side: the rank's fp32 master weights and AdamW moments in host memory -- or,
// with offload_optimizer {device: nvme} (ZeRO-Infinity), in a swap file visited chunk by chunk
// (trainer/nvme/state_swapper.hpp) -- and the update on the CPU (trainer/adamw.hpp: all threads,
// vectorised), pipelined with the transfers. Gradients come down through a ring of page-locked chunk
// buffers, and each chunk's updated weights (already rounded to T) go up through another while the CPU
// works on the next chunk: the rings are all the page-locked memory it takes, a few hundred megabytes
// whatever the model's size (page-locking tens of gigabytes takes as many seconds at start-up, and
// that memory is then lost to everything else). With offload_param {device: cpu} the weights in T
// live in (page-locked) host memory themselves: the CPU writes them there directly, and nothing goes
// up; with {device: nvme} they live in a swap of their own (param_partition.hpp), rounded into it in
// the same pass as the states.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/huge_pages.hpp"
#include "ckpt/shard_format.hpp"
#include "model/cuda/cuda_common.hpp"
#include "trainer/cuda/param_partition.hpp"
#include "trainer/nvme/state_swapper.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
class HostOptimizer {
 public:
  // Sets elements [offset, offset + size) of the optimizer's states (master weights first), handed over
  // zeroed.
  using StatesFill = std::function<void(int64_t offset, std::span<const std::span<float>> states)>;

  // Elements per slot of the transfer rings (64 MiB of fp32 gradients): large transfers, yet the first
  // upload starts after a small fraction of the update. Four slots: the copies of the next chunks run
  // while the CPU updates one.
  static constexpr int64_t kRingChunk = int64_t{16} << 20;
  static constexpr int kSlots = 4;

  // `count` elements of each of `optimizer`'s states, in host memory, or in `swap` (those states of
  // `count` elements) where given. `weights`: where upload() and step() put the updated weights -- in T in device
  // memory (up through a ring of page-locked buffers) or in page-locked host memory, or in
  // `weight_swap` (one state of `count` elements of T, not owned).
  // `ring_chunk`: elements per ring slot (tests take small ones).
  HostOptimizer(size_t count, const Optimizer& optimizer, ParamHome weights, std::unique_ptr<nvme::StateSwapper> swap,
                nvme::StateSwapper* weight_swap = nullptr, int64_t ring_chunk = kRingChunk);

  size_t size() const noexcept { return count_; }
  const nvme::StateSwapper* swapper() const noexcept { return swap_.get(); }
  // The states' bytes in host memory (none when swapped).
  int64_t host_state_bytes() const noexcept {
    return swap_ ? 0 : optimizer_.state_bytes() * static_cast<int64_t>(count_);
  }
  // The page-locked transfer buffers an optimizer of `count` elements allocates.
  static int64_t pinned_bytes(size_t count, ParamHome weights, int64_t ring_chunk = kRingChunk) noexcept;

  // Sets every element of the states: `fill` is called for consecutive chunks of them in order (all
  // at once in host memory).
  void fill(const StatesFill& fill);
  // Elements [offset, offset + count) of the optimizer's state `state` (0: master weights) handed to
  // `sink` in order, in one piece or several. Not concurrently with step() (the backend's snapshot
  // gate keeps them apart).
  void read(int state, int64_t offset, int64_t count, const std::function<void(std::span<const float>)>& sink);

  // params (count elements; null for ParamHome::kSwap) = the master weights in T, once the work queued
  // on `stream` so far is done (it may read them); complete on return.
  void upload(T* params, cudaStream_t stream);

  // One optimizer step from the device gradients `grads` (count fp32, complete once `stream` reaches this
  // point), without weight decay on the elements `no_decay` names (its table in host memory); the
  // updated weights land in `params` in T (null for ParamHome::kSwap): in device memory queued on
  // `stream`, in host memory or the weight swap on return (written once `stream` has reached this
  // point, so work queued before may read them).
  void step(const float* grads, T* params, const OptimizerStep& step, NoDecayRanges no_decay, cudaStream_t stream);

 private:
  using Access = nvme::StateSwapper::Access;
  using Chunk = nvme::StateSwapper::Chunk;
  // The work of a pass on one piece: elements [offset, offset + states[i].size()) of the selected
  // states, their gradients (step: in a ring slot; upload: null) and where their weights in T go
  // (null where the weight swap takes them after the pass).
  using PieceWork =
      std::function<void(int64_t offset, std::span<const std::span<float>> states, const float* grads, T* weights)>;

  // Visits `states` chunk by chunk with `access`: the swap's chunks, or in host memory chunks of
  // `host_chunk` elements. With `mirror` (the states include the master weights) the weight swap
  // receives them in T: with the states swapped, in the same pipeline -- visit_chunk gets the weight
  // swap's chunk of the same elements and must fill it -- else (visit_chunk gets null) rounded from
  // host memory in a visit of the weight swap after this one.
  void visit(Access access, std::span<const int> states, int64_t host_chunk, bool mirror,
             const std::function<void(const Chunk&, T* weights)>& visit_chunk);
  // One pass over the states that writes the weights: every ring chunk's gradients (when `grads` is
  // given) come down ahead of the CPU, `work` runs on each piece (one swap chunk within one ring
  // chunk), and each ring chunk's weights go up (or to the weight swap) once the CPU is through it.
  void pass(Access access, std::span<const int> states, const float* grads, T* params, cudaStream_t stream,
            const PieceWork& work);

  size_t count_;
  const Optimizer& optimizer_;
  std::vector<int> all_states_;  // 0, 1, ... one per state of the optimizer
  ParamHome weights_;
  std::unique_ptr<nvme::StateSwapper> swap_;
  nvme::StateSwapper* weight_swap_;        // ParamHome::kSwap
  std::vector<HugeBuffer<float>> states_;  // in host memory (empty when swapped)
  int64_t ring_chunk_;                     // elements per ring slot
  int slots_;
  model::cuda::PinnedBuffer<float> grad_ring_;  // slots_ chunks of gradients on their way down
  model::cuda::PinnedBuffer<T> weight_ring_;    // ParamHome::kDevice: slots_ chunks of weights on their way up
  std::vector<model::cuda::Event> down_, up_;   // per slot: its gradients have arrived; its weights have left
};

}  // namespace shardkit::trainer::cuda
