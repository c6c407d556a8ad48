#include "model/cuda/block_outputs.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace shardkit::model::cuda {

template <typename T>
BlockOutputs<T>::BlockOutputs(int blocks, size_t count, bool on_host, cudaStream_t stream)
    : blocks_(blocks), count_(count), on_host_(on_host), stream_(stream) {
  device_.resize(count * static_cast<size_t>(on_host ? std::min(blocks, 2) : blocks));
  if (on_host) host_.resize(count * static_cast<size_t>(std::max(blocks - 1, 0)));
}

template <typename T>
ActivationBytes BlockOutputs<T>::bytes_for(int blocks, size_t count, bool on_host) noexcept {
  const auto bytes = [&](int n) { return static_cast<int64_t>(count * sizeof(T)) * std::max(n, 0); };
  if (!on_host) return {bytes(blocks), 0};
  return {bytes(std::min(blocks, 2)), bytes(blocks - 1)};
}

template <typename T>
T* BlockOutputs<T>::output(int l) {
  // The slot's previous output (block l-2's) must be on the host before this one overwrites it.
  if (on_host_ && l >= 2) CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_[l % 2].get(), 0));
  return slot(l);
}

template <typename T>
const T* BlockOutputs<T>::written(int l) {
  if (!on_host_ || l == blocks_ - 1) return slot(l);
  order_.order(stream_, copies_.get());
  CUDA_CHECK(cudaMemcpyAsync(host_.data() + static_cast<size_t>(l) * count_, slot(l), count_ * sizeof(T),
                             cudaMemcpyDeviceToHost, copies_.get()));
  CUDA_CHECK(cudaEventRecord(ready_[l % 2].get(), copies_.get()));
  return slot(l);
}

template <typename T>
void BlockOutputs<T>::prefetch(int l) {
  // Behind everything queued so far: the backward pass of block l+2, the last reader of the slot.
  order_.order(stream_, copies_.get());
  CUDA_CHECK(cudaMemcpyAsync(slot(l), host_.data() + static_cast<size_t>(l) * count_, count_ * sizeof(T),
                             cudaMemcpyHostToDevice, copies_.get()));
  CUDA_CHECK(cudaEventRecord(ready_[l % 2].get(), copies_.get()));
}

template <typename T>
void BlockOutputs<T>::start_backward() {
  // Block L-1's output is still in its slot; block L-2's is fetched while the final norm's backward
  // pass runs (its slot's copy down, queued earlier on the same stream, is done first).
  if (on_host_ && blocks_ >= 2) prefetch(blocks_ - 2);
}

template <typename T>
const T* BlockOutputs<T>::input(int l) {
  if (on_host_ && l < blocks_ - 1) {
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_[l % 2].get(), 0));
    // The next block down reads block l-1's output: fetched while this one computes.
    if (l >= 1) prefetch(l - 1);
  }
  return slot(l);
}

template <typename T>
void BlockOutputs<T>::join() {
  if (on_host_) order_.order(copies_.get(), stream_);
}

template class BlockOutputs<float>;
template class BlockOutputs<__nv_bfloat16>;
template class BlockOutputs<__half>;

}  // namespace shardkit::model::cuda
