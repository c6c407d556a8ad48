#include "comm/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/clock.hpp"
#include "base/error.hpp"

namespace shardkit::comm {
namespace {

// The collectives of one thread, written by that thread alone with plain stores (no clock read, no
// read-modify-write: the hot path costs next to nothing); the watchdog times what it sees.
struct Slot {
  std::atomic<uint64_t> calls{0};  // incremented as a collective begins and as it ends: odd while in one
  std::atomic<const char*> name{nullptr};
  // The watchdog's own, under slots_mutex: the odd count it last saw and since when.
  uint64_t seen_calls = 0;
  Clock::time_point seen_since;
};

// Every thread's slot, for the watchdog to look at; a thread adds its own on its first collective.
std::mutex slots_mutex;
std::vector<Slot*> slots;

struct ThreadSlot {
  Slot slot;
  ThreadSlot() {
    const std::lock_guard<std::mutex> lock(slots_mutex);
    slots.push_back(&slot);
  }
  ~ThreadSlot() {
    const std::lock_guard<std::mutex> lock(slots_mutex);
    slots.erase(std::find(slots.begin(), slots.end(), &slot));
  }
};

Slot& this_thread_slot() {
  thread_local ThreadSlot mine;
  return mine.slot;
}

double timeout_from(const char* variable, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value <= 0) {
    fail(ErrorKind::kInvalidInput,
         std::string(variable) + ": '" + text + "' is not a number of seconds > 0 (default 600)");
  }
  return value;
}

}  // namespace

double collective_timeout_seconds() {
  static const double seconds = [] {
    for (const char* variable : {"SHARDKIT_COLLECTIVE_TIMEOUT", "SHARDKIT_NCCL_TIMEOUT"}) {
      const char* text = std::getenv(variable);
      if (text != nullptr && *text != '\0') return timeout_from(variable, text);
    }
    return 600.0;
  }();
  return seconds;
}

CollectiveTimer::CollectiveTimer(const char* name) noexcept {
  Slot& slot = this_thread_slot();
  const uint64_t calls = slot.calls.load(std::memory_order_relaxed);
  outer_ = calls % 2 == 1;
  if (outer_) return;
  slot.name.store(name, std::memory_order_relaxed);
  slot.calls.store(calls + 1, std::memory_order_release);  // the name is seen with the odd count
}

CollectiveTimer::~CollectiveTimer() {
  if (outer_) return;
  Slot& slot = this_thread_slot();
  slot.calls.store(slot.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

CollectiveWatchdog::CollectiveWatchdog(int rank, int size)
    : rank_(rank), size_(size), timeout_s_(collective_timeout_seconds()), thread_([this] { watch(); }) {}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void CollectiveWatchdog::watch() {
  // A few looks per timeout, at most one a second: a collective is timed from the first look that
  // finds it outstanding, so the job ends at most a fifth of the timeout late, and an idle watchdog
  // costs nothing measurable.
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 5));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    const auto now = Clock::now();
    const std::lock_guard<std::mutex> slots_lock(slots_mutex);
    for (Slot* slot : slots) {
      const uint64_t calls = slot->calls.load(std::memory_order_acquire);
      if (calls % 2 == 0) continue;
      if (calls != slot->seen_calls) {
        slot->seen_calls = calls;
        slot->seen_since = now;
      }
      const double waited = std::chrono::duration<double>(now - slot->seen_since).count();
      if (waited <= timeout_s_) continue;
      std::fprintf(stderr,
                   "shardkit: rank %d of %d: collective watchdog: %s has waited over %.0f s for the other ranks "
                   "(SHARDKIT_COLLECTIVE_TIMEOUT %g s): a rank stalled or died; ending the job\n",
                   rank_, size_, slot->name.load(std::memory_order_relaxed), waited, timeout_s_);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      ::_exit(1);  // MPI_Abort does not return; should it, the job must still end
    }
  }
}

}  // namespace shardkit::comm
