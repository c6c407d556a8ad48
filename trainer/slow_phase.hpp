// Start-up work whose length grows with the model (allocating and pinning states, initialising or
// loading billions of parameters) must not leave a silent process: a phase that is still running after
// a couple of seconds is announced while it runs, and its duration reported when it ends. Quick
// phases print nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "base/clock.hpp"

namespace shardkit::trainer {

class SlowPhases {
 public:
  using Log = std::function<void(const std::string& line)>;
  // `log` is called from a watcher thread as well as from the caller's.
  explicit SlowPhases(Log log, std::chrono::milliseconds after = std::chrono::seconds(2));
  ~SlowPhases();
  SlowPhases(const SlowPhases&) = delete;
  SlowPhases& operator=(const SlowPhases&) = delete;

  // Runs f() as the phase `what` ("initialising 6.65 B parameters").
  void run(const std::string& what, const std::function<void()>& f);

 private:
  void watch();

  Log log_;
  std::chrono::milliseconds after_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string current_;  // the phase running, empty between phases
  Clock::time_point started_;
  bool announced_ = false;
  bool done_ = false;
  std::thread watcher_;
};

}  // namespace shardkit::trainer
