#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <memory>
#include <string>

#include "base/error.hpp"
#include "trainer/cuda/param_partition.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::grow;
using model::cuda::PinnedBuffer;

template <typename T>
ParamPartition<T>::ParamPartition(size_t count, ParamHome home, std::unique_ptr<nvme::StateSwapper> swap,
                                  int64_t largest_slice)
    : home_(home), swap_(std::move(swap)) {
  if ((home == ParamHome::kSwap) != (swap_ != nullptr) || (swap_ && swap_->elements() != static_cast<int64_t>(count))) {
    fail(ErrorKind::kInternal, "stage 3 partition of " + std::to_string(count) + " elements: swap does not match");
  }
  if (home == ParamHome::kHost) host_.resize(count);
  if (home == ParamHome::kDevice) device_.resize(count);
  if (home == ParamHome::kSwap) {
    if (swap_->element_bytes() != static_cast<int>(sizeof(T))) {
      fail(ErrorKind::kInternal, swap_->path().string() + ": a swap of " + std::to_string(swap_->element_bytes()) +
                                     "-byte elements for a partition of " + std::to_string(sizeof(T)));
    }
    // cudaMallocHost does not promise O_DIRECT's alignment (a small partition's slots came back
    // unaligned): each read goes to the aligned part of a slot one alignment unit larger.
    const size_t need = nvme::StateSwapper::range_bytes(largest_slice, static_cast<int>(sizeof(T)));
    for (int i = 0; i < kSwapSlots; ++i) {
      PinnedBuffer<std::byte>& slot = slots_[static_cast<size_t>(i)];
      slot.resize(need + nvme::kDirectAlignment);
      void* first = slot.data();
      size_t space = slot.size();
      std::align(nvme::kDirectAlignment, need, first, space);
      reads_[static_cast<size_t>(i)].emplace(std::span(static_cast<std::byte*>(first), need));
    }
  }
}

template <typename T>
const T* ParamPartition<T>::on_device(int64_t offset, int64_t count, T* staging, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(T);
  if (home_ == ParamHome::kDevice) return device_.data() + offset;
  if (home_ == ParamHome::kHost) {
    CUDA_CHECK(cudaMemcpyAsync(staging, host_.data() + offset, bytes, cudaMemcpyHostToDevice, stream));
    return staging;
  }
  const size_t slot = static_cast<size_t>(next_slot_);
  next_slot_ = (next_slot_ + 1) % kSwapSlots;
  // The slot's previous copy up has left it before the read overwrites it. (A slice larger than the
  // slot was planned for is Error(kInternal) from the read.)
  CUDA_CHECK(cudaEventSynchronize(slot_sent_[slot].get()));
  swap_->start_read(*reads_[slot], 0, offset, count);
  const std::span<const Bits> slice = swap_->finish_read<Bits>(*reads_[slot]);
  CUDA_CHECK(cudaMemcpyAsync(staging, slice.data(), bytes, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(slot_sent_[slot].get(), stream));
  return staging;
}

template <typename T>
void ParamPartition<T>::store(cudaStream_t stream, const Producer& produce) {
  if (home_ == ParamHome::kSwap) fail(ErrorKind::kInternal, swap_->path().string() + ": written by the GPU optimizer");
  if (home_ == ParamHome::kDevice) {
    produce(0, static_cast<int64_t>(device_.size()), device_.data());
    return;
  }
  const int64_t count = static_cast<int64_t>(host_.size());
  grow(staging_, static_cast<size_t>(std::min(count, kChunk)));
  // On one stream a chunk's copy is done before the next chunk's producer overwrites the staging
  // buffer. The copies over PCIe dominate; overlapping them with the producer would save little.
  for (int64_t lo = 0; lo < count; lo += kChunk) {
    const int64_t n = std::min(kChunk, count - lo);
    produce(lo, n, staging_.data());
    CUDA_CHECK(cudaMemcpyAsync(host_.data() + lo, staging_.data(), static_cast<size_t>(n) * sizeof(T),
                               cudaMemcpyDeviceToHost, stream));
  }
}

template class ParamPartition<float>;
template class ParamPartition<__nv_bfloat16>;
template class ParamPartition<__half>;

}  // namespace shardkit::trainer::cuda
