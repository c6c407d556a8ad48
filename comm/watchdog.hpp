// The collective watchdog: a rank that stalls (alive, but absent from a collective: a hung process, a
// wedged file system, a debugger) leaves the other ranks blocked in MPI forever, since a blocking MPI
// collective has no timeout of its own. Each collective of MpiCollective is marked outstanding by a
// CollectiveTimer; a thread started with MPI looks at the outstanding ones a few times per timeout and,
// when one has been outstanding longer than collective_timeout_seconds(), prints one line naming the
// rank, the collective and the time waited, and ends the job as the NCCL watchdog does on GPUs.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

namespace shardkit::comm {

// How long a collective may wait for the other ranks before the job is ended, on CPU ranks and on
// GPUs alike: SHARDKIT_COLLECTIVE_TIMEOUT seconds, else SHARDKIT_NCCL_TIMEOUT (its older name), else
// 600 (a checkpoint save or a long step on another rank is a healthy wait of minutes). Read once;
// Error(kInvalidInput) for a value that is not a number of seconds > 0.
double collective_timeout_seconds();

// Marks one collective of the calling thread as outstanding for its lifetime. Costs two plain stores
// each way (no clock read, no locked instruction): nothing beside the latency of an MPI call.
class CollectiveTimer {
 public:
  // `name` (a string literal) is what the watchdog's message calls the collective.
  explicit CollectiveTimer(const char* name) noexcept;
  ~CollectiveTimer();
  CollectiveTimer(const CollectiveTimer&) = delete;
  CollectiveTimer& operator=(const CollectiveTimer&) = delete;

 private:
  bool outer_;  // nested in another timer of this thread, which goes on timing the wait
};

// The watching thread, for the lifetime of MPI (MpiRuntime owns one where there are other ranks).
// Past the timeout it prints "shardkit: rank R of N: collective watchdog: ..." and calls MPI_Abort.
class CollectiveWatchdog {
 public:
  CollectiveWatchdog(int rank, int size);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

 private:
  void watch();

  int rank_;
  int size_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardkit::comm
