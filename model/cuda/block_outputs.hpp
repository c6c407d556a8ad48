// Where a GPU model keeps its blocks' outputs for the backward pass: block l's output is block l+1's
// input (block L-1's the final norm's), which the backward pass reads, and, under activation
// checkpointing, the one activation a block keeps. On the device, one per block; or
// (cpu_checkpointing) in page-locked host memory, with two device slots that the blocks take turns in:
// each output is copied down on a stream of its own while the next block computes, and copied back up
// one block ahead of the backward pass that reads it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::model::cuda {

// A GPU model's activation memory: on the device, and page-locked on the host.
struct ActivationBytes {
  int64_t device = 0;
  int64_t host = 0;
};

template <typename T>
class BlockOutputs {
 public:
  // `blocks` outputs of `count` elements each, kept on the host when `on_host`; copies are ordered
  // against `stream`, the model's.
  BlockOutputs(int blocks, size_t count, bool on_host, cudaStream_t stream);
  // What an instance of this shape holds, before making one.
  static ActivationBytes bytes_for(int blocks, size_t count, bool on_host) noexcept;
  ActivationBytes bytes() const noexcept { return bytes_for(blocks_, count_, on_host_); }

  // Forward pass, in block order. Where block l writes its output (on the host: once the copy of the
  // output that used the slot before is done); readable on the device until block l+2 writes.
  T* output(int l);
  // Block l has queued the writing of its output: on the host, its copy down starts behind it (the last
  // block's is never copied: the backward pass starts with it still in its slot). Returns the output
  // for the next block, or the final norm, to read.
  const T* written(int l);
  // Backward pass, from the last block down: block l's output for the block above it (and the final
  // norm: l = L-1) to read. On the host, start_backward() and each input() queue the copy up of the
  // output that the next block down will read.
  void start_backward();
  const T* input(int l);
  // The model's stream waits for every copy queued (the end of a pass; a CUDA graph's capture must
  // end with the side stream joined).
  void join();

 private:
  T* slot(int l) const noexcept { return device_.data() + static_cast<size_t>(on_host_ ? l % 2 : l) * count_; }
  // Queues the copy up of block l's output into its slot, behind everything the model queued so far.
  void prefetch(int l);

  int blocks_;
  size_t count_;
  bool on_host_;
  cudaStream_t stream_;
  DeviceBuffer<T> device_;  // (blocks, count), or (2, count) on the host
  PinnedBuffer<T> host_;    // (blocks - 1, count) on the host
  Stream copies_;           // the copies down and up (on the host only)
  Event order_;             // the model's stream ahead of a copy
  Event ready_[2];          // the last copy into or out of each slot is done
};

}  // namespace shardkit::model::cuda
