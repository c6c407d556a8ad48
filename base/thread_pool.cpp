#include "base/thread_pool.hpp"

#include <algorithm>
#include <utility>

namespace shardkit {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads(int requested) {
  if (requested > 0) return requested;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::min(hw, 8) - 1;
}

void ThreadPool::run_indices(int worker) {
  std::unique_lock lock(mutex_);
  while (next_ < n_) {
    const size_t index = next_++;
    lock.unlock();
    try {
      (*body_)(index, worker);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      finished_ += 1 + (n_ - next_);  // skip what is left
      next_ = n_;
      if (finished_ == n_) done_.notify_all();
      continue;
    }
    lock.lock();
    if (++finished_ == n_) done_.notify_all();
  }
}

void ThreadPool::worker_loop(int worker) {
  unsigned seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    run_indices(worker);
    lock.lock();
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, int)>& body) {
  if (n == 0) return;
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_indices(0);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return finished_ == n_; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace shardkit
