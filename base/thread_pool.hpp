// A small fixed pool of worker threads for data-parallel loops (chunk compression, checksums,
// parallel reads). The calling thread takes part in every loop.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardkit {

class ThreadPool {
 public:
  // `threads` extra workers (0 = run everything on the caller).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Number of distinct `worker` values passed to loop bodies: the workers plus the caller.
  int concurrency() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(index, worker) for every index in [0, n), worker in [0, concurrency()), and returns
  // when all are done. Not reentrant. If bodies throw, the first exception is rethrown here (the
  // remaining indices are skipped).
  void parallel_for(size_t n, const std::function<void(size_t index, int worker)>& body);

  // Worker count for `requested` threads: requested > 0 as is, else min(hardware threads, 8) - 1.
  static int default_threads(int requested);

 private:
  void worker_loop(int worker);
  void run_indices(int worker);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, int)>* body_ = nullptr;
  size_t n_ = 0;
  size_t next_ = 0;
  size_t finished_ = 0;
  unsigned generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace shardkit
