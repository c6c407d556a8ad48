// ZeRO stage 3: the rank's partition of the parameters in T (the layout's F slot elements), which the
// all-gathers read and the optimizer step writes. It lives in device memory or, with offload_param
// {device: cpu}, in page-locked host memory, so that the GPU holds only the groups gathered from it.
// This class is the one place that knows which: readers get a device copy of a slice, writers hand it
// device work whose results it makes the partition's contents.
#pragma once

#include <cstdint>
#include <functional>

#include "trainer/cuda/cuda_common.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
class ParamPartition {
 public:
  // `count` elements, in page-locked host memory when `on_host`, else in device memory.
  ParamPartition(size_t count, bool on_host);

  // Whether the elements are in host memory (false when there are none).
  bool on_host() const noexcept { return host_.size() > 0; }
  // The elements: host memory when on_host(), else device memory.
  T* data() const noexcept { return on_host() ? host_.data() : device_.data(); }
  int64_t device_bytes() const noexcept { return static_cast<int64_t>(device_.bytes()); }
  int64_t host_bytes() const noexcept { return static_cast<int64_t>(host_.size() * sizeof(T)); }

  // Elements [offset, offset + count) in device memory, for the work queued on `stream` after this
  // call: the partition itself, or, in host memory, a copy into `staging` (device memory, `count`
  // elements) queued on `stream`.
  const T* on_device(int64_t offset, int64_t count, T* staging, cudaStream_t stream) const;

  // Device work that writes elements [lo, lo + n) of the partition, in T, to `out` (device memory).
  using Producer = std::function<void(int64_t lo, int64_t n, T* out)>;
  // Makes what `produce` queues on `stream` the partition's contents, complete where `stream` reaches
  // after this call: written in place in device memory; in host memory, in chunks of kChunk elements
  // into a device staging buffer, each copied down on `stream`. Every call uses the same stream.
  void store(cudaStream_t stream, const Producer& produce);
  // Elements per chunk of store() in host memory (32 MiB in bf16): few launches and copies, little
  // device memory.
  static constexpr int64_t kChunk = int64_t{16} << 20;

 private:
  DeviceBuffer<T> device_;
  PinnedBuffer<T> host_;
  DeviceBuffer<T> staging_;  // in host memory: one chunk of store()'s results on its way down
};

}  // namespace shardkit::trainer::cuda
