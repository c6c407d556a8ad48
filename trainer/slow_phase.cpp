#include "trainer/slow_phase.hpp"

#include <cstdio>

#include "base/clock.hpp"

namespace shardkit::trainer {

SlowPhases::SlowPhases(Log log, std::chrono::milliseconds after)
    : log_(std::move(log)), after_(after), watcher_([this] { watch(); }) {}

SlowPhases::~SlowPhases() {
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  changed_.notify_all();
  watcher_.join();
}

void SlowPhases::run(const std::string& what, const std::function<void()>& f) {
  {
    const std::lock_guard lock(mutex_);
    current_ = what;
    started_ = Clock::now();
    announced_ = false;
  }
  changed_.notify_all();
  struct End {  // the phase ends even when f throws, so that the watcher never announces it late
    SlowPhases& p;
    ~End() {
      const std::lock_guard lock(p.mutex_);
      p.current_.clear();
    }
  };
  bool announced = false;
  Clock::time_point started;
  {
    End end{*this};
    f();
    const std::lock_guard lock(mutex_);
    announced = announced_;
    started = started_;
  }
  const double seconds = seconds_since(started);
  if (announced || seconds * 1000 >= static_cast<double>(after_.count())) {
    char line[64];
    std::snprintf(line, sizeof(line), " done in %.1f s", seconds);
    log_(what + line);
  }
}

void SlowPhases::watch() {
  std::unique_lock lock(mutex_);
  while (!done_) {
    if (current_.empty() || announced_) {
      changed_.wait(lock);
      continue;
    }
    const auto due = started_ + after_;
    if (Clock::now() < due) {
      changed_.wait_until(lock, due);
      continue;
    }
    announced_ = true;
    const std::string line = current_ + " ...";
    lock.unlock();
    log_(line);
    lock.lock();
  }
}

}  // namespace shardkit::trainer
