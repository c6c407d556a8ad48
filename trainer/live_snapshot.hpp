// Snapshots of optimizer states that live in host memory (CPU ranks, or offloaded from a GPU): a copy,
// which the save writes while training goes on, or none where host memory has no room for one: the
// save then reads the live states, and the gate holds the next optimizer step back until the save is
// done with them (as for states swapped to NVMe, which are never copied).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "base/text_format.hpp"
#include "trainer/backend.hpp"

namespace shardkit::trainer {

class SnapshotGate {
 public:
  // The save starts reading the states.
  void close() {
    const std::lock_guard lock(mutex_);
    closed_ = true;
    waited_ms_ = 0;
  }
  // The save is done with them (from the save's thread).
  void open() {
    {
      const std::lock_guard lock(mutex_);
      closed_ = false;
    }
    opened_.notify_all();
  }
  // Before the optimizer step changes the states.
  void wait_open() {
    std::unique_lock lock(mutex_);
    if (!closed_) return;
    const auto start = Clock::now();
    opened_.wait(lock, [this] { return !closed_; });
    waited_ms_ += ms_since(start);
  }
  // How long steps waited since the last close().
  double waited_ms() {
    const std::lock_guard lock(mutex_);
    return waited_ms_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool closed_ = false;
  double waited_ms_ = 0;
};

// Whether a copy of `bytes_per_rank` of states for each of the node's `ranks_on_node` ranks fits in
// `available` bytes of host memory, leaving a tenth of `total` (at least 2 GiB) for everything else
// the node runs.
constexpr bool host_copy_fits(int64_t bytes_per_rank, int ranks_on_node, int64_t available, int64_t total) {
  const int64_t headroom = total / 10 > (int64_t{2} << 30) ? total / 10 : int64_t{2} << 30;
  return bytes_per_rank * ranks_on_node + headroom <= available;
}

// States swapped to NVMe are too large to be held twice: a save reads them from the swap file
// (Backend::stream_snapshot), behind the snapshot gate. Says so once.
inline void note_swapped_snapshots(const BackendOptions& options) {
  if (options.log) {
    options.log(
        "checkpoint snapshots: none: a save reads the optimizer states from the swap file, and the optimizer step "
        "after it waits until they are written");
  }
}

// Whether each rank's snapshot of `bytes_per_rank` of host-resident states is a copy in host memory
// (true) or the live states (false), as options.snapshot_staging says (kAuto: a copy where the node's
// available memory holds one for each of its ranks). The same on every rank (collective); the choice
// is said once.
inline bool snapshot_copies_states(const BackendOptions& options, int64_t bytes_per_rank) {
  const auto log = [&](const std::string& line) {
    if (options.log) options.log("checkpoint snapshots: " + line);
  };
  const std::string size = format_bytes(static_cast<double>(bytes_per_rank));
  const std::string copy = "a copy of the optimizer states in host memory (" + size +
                           " a rank), written while "
                           "training goes on";
  const std::string live =
      "a save reads the live optimizer states, and the optimizer step after it waits until "
      "they are written";
  switch (options.snapshot_staging) {
    case SnapshotStaging::kHost:
      log(copy);
      return true;
    case SnapshotStaging::kNone:
      log("none: " + live + " (--snapshot-staging none)");
      return false;
    case SnapshotStaging::kDevice:
      fail(ErrorKind::kInternal, "a device staging copy of states that live in host memory");
    case SnapshotStaging::kAuto:
      break;
  }
  const int ranks_on_node = options.comm->node_place().size;
  const double available = available_memory_bytes();
  const bool fits = host_copy_fits(bytes_per_rank, ranks_on_node, static_cast<int64_t>(available),
                                   static_cast<int64_t>(physical_memory_bytes()));
  if (options.comm->allreduce_max(fits ? 0.0 : 1.0) == 0.0) {
    log(copy);
    return true;
  }
  log("none: a copy (" + size + " for each of the node's " + std::to_string(ranks_on_node) + " ranks) would not fit " +
      "in the " + format_bytes(available) + " of host memory available; " + live +
      " (--snapshot-staging host forces a copy)");
  return false;
}

}  // namespace shardkit::trainer
