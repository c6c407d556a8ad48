// Device buffers reused across streams without synchronising the host. A buffer given back remembers,
// as an event, the point of the stream that used it last; whoever takes it next makes its own stream
// wait for that point first. So a gathered parameter can be released as soon as its kernels are
// queued, and the next all-gather (on another stream) reuses its memory no earlier than they finish.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::trainer::cuda {

template <typename U>
class BufferPool {
 public:
  // A buffer of exactly `count` elements that `user` may use from now on (in stream order).
  model::cuda::DeviceBuffer<U> take(size_t count, cudaStream_t user) {
    auto& free = free_[count];
    if (free.empty()) return model::cuda::DeviceBuffer<U>(count);
    Entry e = std::move(free.back());
    free.pop_back();
    CUDA_CHECK(cudaStreamWaitEvent(user, e.last_use->get(), 0));
    events_.push_back(std::move(e.last_use));
    return std::move(e.buffer);
  }

  // Gives `buffer` back; `last_user` is the stream whose queued work is the last to touch it.
  void give(model::cuda::DeviceBuffer<U>&& buffer, cudaStream_t last_user) {
    if (buffer.size() == 0) return;
    std::unique_ptr<model::cuda::Event> event;
    if (events_.empty()) {
      event = std::make_unique<model::cuda::Event>();
    } else {
      event = std::move(events_.back());
      events_.pop_back();
    }
    CUDA_CHECK(cudaEventRecord(event->get(), last_user));
    const size_t count = buffer.size();
    free_[count].push_back({std::move(buffer), std::move(event)});
  }

 private:
  struct Entry {
    model::cuda::DeviceBuffer<U> buffer;
    std::unique_ptr<model::cuda::Event> last_use;
  };
  std::map<size_t, std::vector<Entry>> free_;
  std::vector<std::unique_ptr<model::cuda::Event>> events_;  // recycled
};

}  // namespace shardkit::trainer::cuda
