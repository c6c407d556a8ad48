#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <type_traits>

#include "base/error.hpp"
#include "base/parallel_memory.hpp"
#include "model/cuda/device_type.hpp"
#include "trainer/cuda/host_optimizer.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::DeviceType;

namespace {

// out = the fp32 weights in T (rounded to nearest even), on all threads.
template <typename T>
void narrow_into(std::span<const float> in, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(out, in.data(), in.size_bytes());
  } else {
    narrow_weights(in, DeviceType<T>::kNarrow, reinterpret_cast<uint16_t*>(out));
  }
}

constexpr int kMaster[] = {0};

// No larger than the states, for small models.
int64_t ring_chunk_of(size_t count, int64_t ring_chunk) {
  return std::max<int64_t>(1, std::min<int64_t>(ring_chunk, static_cast<int64_t>(count)));
}

// A chunk of the weight swap (its elements are T's bit patterns) as T.
template <typename T>
std::span<T> weights_in(const nvme::StateSwapper::Chunk& chunk) {
  if constexpr (std::is_same_v<T, float>) {
    return chunk.states[0];
  } else {
    const std::span<uint16_t> bits = chunk.bits16[0];
    return {reinterpret_cast<T*>(bits.data()), bits.size()};
  }
}

// As many slots as the ring has chunks, at most kSlots.
template <typename T>
int slots_of(size_t count, int64_t ring_chunk) {
  const int64_t chunk = ring_chunk_of(count, ring_chunk);
  const int64_t chunks = (static_cast<int64_t>(count) + chunk - 1) / chunk;
  return static_cast<int>(std::clamp<int64_t>(chunks, 1, HostOptimizer<T>::kSlots));
}

}  // namespace

template <typename T>
int64_t HostOptimizer<T>::pinned_bytes(size_t count, ParamHome weights, int64_t ring_chunk) noexcept {
  return slots_of<T>(count, ring_chunk) * ring_chunk_of(count, ring_chunk) *
         static_cast<int64_t>(sizeof(float) + (weights == ParamHome::kDevice ? sizeof(T) : 0));
}

template <typename T>
HostOptimizer<T>::HostOptimizer(size_t count, const Optimizer& optimizer, ParamHome weights,
                                std::unique_ptr<nvme::StateSwapper> swap, nvme::StateSwapper* weight_swap,
                                int64_t ring_chunk)
    : count_(count),
      optimizer_(optimizer),
      weights_(weights),
      swap_(std::move(swap)),
      weight_swap_(weight_swap),
      ring_chunk_(ring_chunk_of(count, ring_chunk)),
      slots_(slots_of<T>(count, ring_chunk)),
      grad_ring_(static_cast<size_t>(slots_ * ring_chunk_)),
      weight_ring_(weights == ParamHome::kDevice ? static_cast<size_t>(slots_ * ring_chunk_) : 0),
      down_(static_cast<size_t>(slots_)),
      up_(static_cast<size_t>(slots_)) {
  for (int s = 0; s < optimizer.num_states(); ++s) {
    all_states_.push_back(s);
    if (!swap_) states_.emplace_back(count);
  }
  if (swap_ && static_cast<int>(swap_->all_states().size()) != optimizer.num_states()) {
    fail(ErrorKind::kInternal, swap_->path().string() + ": a swap of " + std::to_string(swap_->all_states().size()) +
                                   " states for " + std::string(optimizer.name) + "'s " +
                                   std::to_string(optimizer.num_states()));
  }
  for (const nvme::StateSwapper* s : {swap_.get(), weight_swap_}) {
    if (s && s->elements() != static_cast<int64_t>(count)) {
      fail(ErrorKind::kInternal, s->path().string() + ": a swap of " + std::to_string(s->elements()) +
                                     " elements for an optimizer of " + std::to_string(count));
    }
  }
  if (weight_swap_ && weight_swap_->element_bytes() != static_cast<int>(sizeof(T))) {
    fail(ErrorKind::kInternal, weight_swap_->path().string() + ": a weight swap of " +
                                   std::to_string(weight_swap_->element_bytes()) + "-byte elements for weights of " +
                                   std::to_string(sizeof(T)));
  }
  if ((weights == ParamHome::kSwap) != (weight_swap_ != nullptr)) {
    fail(ErrorKind::kInternal, "host optimizer: a weight swap goes with ParamHome::kSwap");
  }
}

template <typename T>
void HostOptimizer<T>::visit(Access access, std::span<const int> states, int64_t host_chunk, bool mirror,
                             const std::function<void(const Chunk&, T* weights)>& visit_chunk) {
  if (swap_ && mirror) {
    const nvme::StateSwapper::Part parts[] = {{swap_.get(), access, states}, {weight_swap_, Access::kWrite, kMaster}};
    nvme::StateSwapper::visit(
        parts, [&](std::span<const Chunk> chunks) { visit_chunk(chunks[0], weights_in<T>(chunks[1]).data()); });
    return;
  }
  if (swap_) {
    swap_->visit(access, states, [&](const Chunk& chunk) { visit_chunk(chunk, nullptr); });
    return;
  }
  const int64_t n = static_cast<int64_t>(count_);
  for (int64_t lo = 0; lo < n; lo += host_chunk) {
    const size_t len = static_cast<size_t>(std::min(host_chunk, n - lo));
    Chunk chunk{lo, {}, {}};
    for (const int s : states)
      chunk.states[static_cast<size_t>(s)] = {states_[static_cast<size_t>(s)].data() + lo, len};
    visit_chunk(chunk, nullptr);
  }
  if (mirror) {
    weight_swap_->visit(Access::kWrite, kMaster, [&](const Chunk& chunk) {
      const std::span<T> out = weights_in<T>(chunk);
      narrow_into(std::span<const float>(states_[0].data() + chunk.offset, out.size()), out.data());
    });
  }
}

template <typename T>
void HostOptimizer<T>::fill(const StatesFill& fill) {
  // In host memory, one call for everything: the zeroing (on all threads) is also the first touch of
  // the pages, which then spreads over the threads.
  visit(Access::kWrite, all_states_, std::max<int64_t>(1, static_cast<int64_t>(count_)), false,
        [&](const Chunk& chunk, T*) {
          const std::span<const std::span<float>> states =
              std::span(chunk.states).first(static_cast<size_t>(optimizer_.num_states()));
          for (const std::span<float> s : states) parallel_fill(s.data(), static_cast<int64_t>(s.size()), 0.0f);
          fill(chunk.offset, states);
        });
}

template <typename T>
void HostOptimizer<T>::read(int state, int64_t offset, int64_t count,
                            const std::function<void(std::span<const float>)>& sink) {
  const int states[] = {state};
  visit(Access::kRead, states, std::max<int64_t>(1, static_cast<int64_t>(count_)), false, [&](const Chunk& chunk, T*) {
    const std::span<const float> s = chunk.states[static_cast<size_t>(state)];
    const int64_t lo = std::max(offset, chunk.offset);
    const int64_t hi = std::min(offset + count, chunk.offset + static_cast<int64_t>(s.size()));
    if (lo < hi) sink(s.subspan(static_cast<size_t>(lo - chunk.offset), static_cast<size_t>(hi - lo)));
  });
}

template <typename T>
void HostOptimizer<T>::pass(Access access, std::span<const int> states, const float* grads, T* params,
                            cudaStream_t stream, const PieceWork& work) {
  const int64_t n = static_cast<int64_t>(count_);
  const int64_t chunks = (n + ring_chunk_ - 1) / ring_chunk_;
  const auto slot = [&](int64_t k) { return static_cast<size_t>(k % slots_); };
  const auto ring_offset = [&](int64_t k) { return slot(k) * static_cast<size_t>(ring_chunk_); };
  const auto length = [&](int64_t k) { return static_cast<size_t>(std::min(ring_chunk_, n - k * ring_chunk_)); };
  const auto come_down = [&](int64_t k) {
    CUDA_CHECK(cudaMemcpyAsync(grad_ring_.data() + ring_offset(k), grads + k * ring_chunk_, length(k) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaEventRecord(down_[slot(k)].get(), stream));
  };
  if (grads != nullptr) {
    for (int64_t k = 0; k < std::min<int64_t>(slots_, chunks); ++k) come_down(k);
  }
  // Ring chunk k is entered when the CPU reaches it and left when the CPU is through it.
  const auto enter = [&](int64_t k) {
    if (grads != nullptr) CUDA_CHECK(cudaEventSynchronize(down_[slot(k)].get()));
    // The slot's weights of chunk k - slots (or of the last pass) have gone up.
    if (weights_ == ParamHome::kDevice) CUDA_CHECK(cudaEventSynchronize(up_[slot(k)].get()));
  };
  const auto leave = [&](int64_t k) {
    if (weights_ == ParamHome::kDevice) {
      CUDA_CHECK(cudaMemcpyAsync(params + k * ring_chunk_, weight_ring_.data() + ring_offset(k), length(k) * sizeof(T),
                                 cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaEventRecord(up_[slot(k)].get(), stream));
    }
    if (grads != nullptr && k + slots_ < chunks) come_down(k + slots_);
  };
  int64_t current = -1;
  std::array<std::span<float>, nvme::kMaxStates> piece{};
  const bool mirror = weights_ == ParamHome::kSwap;
  visit(access, states, ring_chunk_, mirror, [&](const Chunk& chunk, T* swapped_weights) {
    const int64_t end = chunk.offset + static_cast<int64_t>(chunk.states[static_cast<size_t>(states[0])].size());
    // A swap chunk may straddle ring chunks: its pieces in each.
    for (int64_t lo = chunk.offset; lo < end;) {
      const int64_t k = lo / ring_chunk_;
      const int64_t hi = std::min(end, (k + 1) * ring_chunk_);
      if (k != current) {
        if (current >= 0) leave(current);
        enter(k);
        current = k;
      }
      for (const int s : states) {
        piece[static_cast<size_t>(s)] = chunk.states[static_cast<size_t>(s)].subspan(
            static_cast<size_t>(lo - chunk.offset), static_cast<size_t>(hi - lo));
      }
      const size_t in_slot = ring_offset(k) + static_cast<size_t>(lo - k * ring_chunk_);
      T* weights = mirror                         ? (swapped_weights ? swapped_weights + (lo - chunk.offset) : nullptr)
                   : weights_ == ParamHome::kHost ? params + lo
                                                  : weight_ring_.data() + in_slot;
      work(lo, piece, grads != nullptr ? grad_ring_.data() + in_slot : nullptr, weights);
      lo = hi;
    }
  });
  if (current >= 0) leave(current);
}

template <typename T>
void HostOptimizer<T>::upload(T* params, cudaStream_t stream) {
  // Outside the training step (initialize, load), where a host wait costs nothing.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  pass(Access::kRead, kMaster, nullptr, params, stream,
       [](int64_t, std::span<const std::span<float>> states, const float*, T* weights) {
         if (weights != nullptr) narrow_into(states[0], weights);
       });
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename T>
void HostOptimizer<T>::step(const float* grads, T* params, const OptimizerStep& step, NoDecayRanges no_decay,
                            cudaStream_t stream) {
  pass(Access::kUpdate, all_states_, grads, params, stream,
       [&](int64_t offset, std::span<const std::span<float>> piece, const float* g, T* weights) {
         const std::span<const std::span<float>> states = piece.first(static_cast<size_t>(optimizer_.num_states()));
         UpdateChunk chunk{states, std::span<const float>(g, states[0].size()), no_decay.at(offset)};
         // The updated weights in T: 16-bit ones rounded in the update's own pass, fp32 ones copied after
         // it; none here where the weight swap takes them after the whole pass (weights null).
         if constexpr (!std::is_same_v<T, float>) {
           if (weights != nullptr) {
             chunk.narrow = DeviceType<T>::kNarrow;
             chunk.narrowed = reinterpret_cast<uint16_t*>(weights);
           }
         }
         optimizer_.cpu_update(step, chunk);
         if constexpr (std::is_same_v<T, float>) {
           if (weights != nullptr) narrow_into(states[0], weights);
         }
       });
}

template class HostOptimizer<float>;
template class HostOptimizer<__nv_bfloat16>;
template class HostOptimizer<__half>;

}  // namespace shardkit::trainer::cuda
