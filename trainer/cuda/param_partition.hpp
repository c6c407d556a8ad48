// ZeRO stage 3: the rank's partition of the parameters in T (the layout's F slot elements), which the
// all-gathers read and the optimizer step writes. It lives in device memory, or with offload_param
// {device: cpu} in page-locked host memory, or with {device: nvme} in a swap file (ZeRO-Infinity), so
// that the GPU holds only the groups gathered from it. This class is the one place that knows which:
// readers get a device copy of a slice, writers hand it device work whose results it makes the
// partition's contents -- except in the swap, which the host optimizer writes in its own pass over the
// master weights (host_optimizer.hpp).
//
// The swap holds the partition in T: the host optimizer rounds each chunk of master weights into it
// as it updates them, in the same pass (and pipeline) that visits the states, so a gather reads the
// slice it needs straight into page-locked memory and copies it up, and the disk moves the bytes of
// T, not of fp32 -- a stage 3 step reads the partition twice (forward and backward gathers).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>

#include "model/cuda/cuda_common.hpp"
#include "trainer/nvme/state_swapper.hpp"

namespace shardkit::trainer::cuda {

// Where a partition lives: device memory, host memory (offload_param cpu), a swap (offload_param nvme).
enum class ParamHome { kDevice, kHost, kSwap };

template <typename T>
class ParamPartition {
 public:
  // `count` elements at `home`; kSwap takes the swap (one state of `count` elements), which the host
  // optimizer fills before the first read, and the most elements one on_device() call will ask for
  // (its page-locked buffers are allocated here, not in the training step).
  ParamPartition(size_t count, ParamHome home, std::unique_ptr<nvme::StateSwapper> swap = {},
                 int64_t largest_slice = 0);

  ParamHome home() const noexcept { return home_; }
  bool on_host() const noexcept { return home_ == ParamHome::kHost; }
  // The elements in T: host memory when on_host(), device memory at home kDevice; null in the swap.
  T* data() const noexcept { return on_host() ? host_.data() : device_.data(); }
  // The swap at home kSwap, else null.
  nvme::StateSwapper* swap() const noexcept { return swap_.get(); }
  int64_t device_bytes() const noexcept { return static_cast<int64_t>(device_.bytes()); }
  int64_t host_bytes() const noexcept { return static_cast<int64_t>(host_.size() * sizeof(T)); }
  int64_t nvme_bytes() const noexcept { return swap_ ? swap_->file_bytes() : 0; }

  // Elements [offset, offset + count) in device memory, for the work queued on `stream` after this
  // call: the partition itself, or a copy into `staging` (device memory, `count` elements) queued on
  // `stream` -- from host memory, or from page-locked memory that the swap's slice was read into
  // (the host waits for the read: the caller gathers ahead of the compute).
  const T* on_device(int64_t offset, int64_t count, T* staging, cudaStream_t stream);
  // The page-locked bytes a partition in a swap allocates for slices of at most `largest_slice` elements.
  static int64_t swap_pinned_bytes(int64_t largest_slice) noexcept {
    const size_t slot = nvme::StateSwapper::range_bytes(largest_slice, static_cast<int>(sizeof(T)));
    return kSwapSlots * static_cast<int64_t>(slot + nvme::kDirectAlignment);  // see the constructor
  }

  // Device work that writes elements [lo, lo + n) of the partition, in T, to `out` (device memory).
  using Producer = std::function<void(int64_t lo, int64_t n, T* out)>;
  // Makes what `produce` queues on `stream` the partition's contents, complete where `stream` reaches
  // after this call: written in place in device memory; in host memory, in chunks of kChunk elements
  // into a device staging buffer, each copied down on `stream`. Every call uses the same stream. Not
  // for the swap (Error(kInternal)).
  void store(cudaStream_t stream, const Producer& produce);
  // Elements per chunk of store() in host memory (32 MiB in bf16): few launches and copies, little
  // device memory.
  static constexpr int64_t kChunk = int64_t{16} << 20;

 private:
  // Page-locked buffers that the swap's slices are read into: one is filled while the other's copy up
  // runs.
  static constexpr int kSwapSlots = 2;
  // The swap's elements as the reads return them: T's bit patterns.
  using Bits = std::conditional_t<sizeof(T) == sizeof(float), float, uint16_t>;

  ParamHome home_;
  model::cuda::DeviceBuffer<T> device_;
  model::cuda::PinnedBuffer<T> host_;
  model::cuda::DeviceBuffer<T> staging_;  // in host memory: one chunk of store()'s results on its way down
  std::unique_ptr<nvme::StateSwapper> swap_;
  std::array<model::cuda::PinnedBuffer<std::byte>, kSwapSlots> slots_;
  std::array<std::optional<nvme::RangeRead>, kSwapSlots> reads_;  // into slots_ (destroyed first: they drain)
  std::array<model::cuda::Event, kSwapSlots> slot_sent_;          // the slot's last copy up has left it
  int next_slot_ = 0;
};

}  // namespace shardkit::trainer::cuda
