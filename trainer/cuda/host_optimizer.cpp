#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "model/cpu/ops.hpp"
#include "trainer/cuda/device_type.hpp"
#include "trainer/cuda/host_optimizer.hpp"

namespace shardkit::trainer::cuda {
namespace {

// Elements per pipeline chunk (64 MiB of fp32 gradients): large transfers, yet the first upload starts
// after a small fraction of the update.
constexpr int64_t kChunk = int64_t{16} << 20;

int64_t chunks_of(size_t count) {
  return (static_cast<int64_t>(count) + kChunk - 1) / kChunk;
}

}  // namespace

template <typename T>
HostOptimizer<T>::HostOptimizer(size_t count, bool params_on_host)
    : params_on_host_(params_on_host),
      master_(count),
      exp_avg_(count),
      exp_avg_sq_(count),
      grad_staging_(count),
      param_staging_(params_on_host ? 0 : count),
      chunk_ready_(static_cast<size_t>(chunks_of(count))) {
  // Zeroed on all the compute threads: tens of gigabytes for a multi-billion-parameter model.
  for (HugeBuffer<float>* state : {&master_, &exp_avg_, &exp_avg_sq_}) {
    model::cpu::fill(state->data(), static_cast<int64_t>(count), 0.0f);
  }
}

template <typename T>
void HostOptimizer<T>::narrow(int64_t lo, int64_t len, T* out) {
  const std::span<const float> in(master_.data() + lo, static_cast<size_t>(len));
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(out + lo, in.data(), in.size_bytes());
  } else {
    narrow_weights(in, DeviceType<T>::kNarrow, reinterpret_cast<uint16_t*>(out + lo));
  }
}

template <typename T>
void HostOptimizer<T>::upload(T* params, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(master_.size());
  if (params_on_host_) {
    // Outside the training step (initialize, load), where a host wait costs nothing.
    CUDA_CHECK(cudaStreamSynchronize(stream));
    narrow(0, n, params);
    return;
  }
  CUDA_CHECK(cudaEventSynchronize(uploaded_.get()));  // the staging buffer may still feed an earlier upload
  narrow(0, n, param_staging_.data());
  CUDA_CHECK(cudaMemcpyAsync(params, param_staging_.data(), static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice,
                             stream));
  CUDA_CHECK(cudaEventRecord(uploaded_.get(), stream));
  CUDA_CHECK(cudaEventSynchronize(uploaded_.get()));
}

template <typename T>
void HostOptimizer<T>::step(const float* grads, T* params, const AdamWCoefficients& c, NoDecayRanges no_decay,
                            cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(master_.size());
  const int64_t chunks = chunks_of(master_.size());
  T* const weights = host_weights(params);
  // The previous step's uploads read the staging buffer: they must be done before it is rewritten.
  // (In host memory the weights are written after the first chunk's wait below: by then `stream` has
  // passed this call, so what was queued before it to read them is done.)
  CUDA_CHECK(cudaEventSynchronize(uploaded_.get()));
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t lo = k * kChunk, len = std::min(kChunk, n - lo);
    CUDA_CHECK(cudaMemcpyAsync(grad_staging_.data() + lo, grads + lo, static_cast<size_t>(len) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaEventRecord(chunk_ready_[static_cast<size_t>(k)].get(), stream));
  }
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t lo = k * kChunk, len = std::min(kChunk, n - lo);
    CUDA_CHECK(cudaEventSynchronize(chunk_ready_[static_cast<size_t>(k)].get()));
    const auto part = [&](HugeBuffer<float>& v) { return std::span<float>(v.data() + lo, static_cast<size_t>(len)); };
    const std::span<const float> g(grad_staging_.data() + lo, static_cast<size_t>(len));
    if constexpr (std::is_same_v<T, float>) {
      cpu_adamw(part(master_), part(exp_avg_), part(exp_avg_sq_), g, c, no_decay.at(lo));
      narrow(lo, len, weights);
    } else {
      cpu_adamw(part(master_), part(exp_avg_), part(exp_avg_sq_), g, c, no_decay.at(lo), DeviceType<T>::kNarrow,
                reinterpret_cast<uint16_t*>(weights + lo));
    }
    if (params_on_host_) continue;
    // Goes up while the CPU updates the next chunk.
    CUDA_CHECK(cudaMemcpyAsync(params + lo, param_staging_.data() + lo, static_cast<size_t>(len) * sizeof(T),
                               cudaMemcpyHostToDevice, stream));
  }
  CUDA_CHECK(cudaEventRecord(uploaded_.get(), stream));
}

template class HostOptimizer<float>;
template class HostOptimizer<__nv_bfloat16>;
template class HostOptimizer<__half>;

}  // namespace shardkit::trainer::cuda
