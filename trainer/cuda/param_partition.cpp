#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "trainer/cuda/param_partition.hpp"

namespace shardkit::trainer::cuda {

template <typename T>
ParamPartition<T>::ParamPartition(size_t count, bool on_host) {
  if (on_host) {
    host_.resize(count);
  } else {
    device_.resize(count);
  }
}

template <typename T>
const T* ParamPartition<T>::on_device(int64_t offset, int64_t count, T* staging, cudaStream_t stream) const {
  if (!on_host()) return device_.data() + offset;
  CUDA_CHECK(cudaMemcpyAsync(staging, host_.data() + offset, static_cast<size_t>(count) * sizeof(T),
                             cudaMemcpyHostToDevice, stream));
  return staging;
}

template <typename T>
void ParamPartition<T>::store(cudaStream_t stream, const Producer& produce) {
  if (!on_host()) {
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
