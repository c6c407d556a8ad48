// Fault injection for the crash-consistency and I/O-error tests, driven by the environment:
//   SHARDKIT_FAULT=<point>    a named instant of the save protocol (below)
//   SHARDKIT_FAULT_RANK=<r>   only on this rank (default: every rank)
//   SHARDKIT_FAULT_STEP=<s>   only while saving the checkpoint of this step (default: any)
// At a crash point the process kills itself with SIGKILL, as `kill -9` at that instant would. At the
// I/O point "enospc" the rank's shard write fails with ENOSPC halfway, as on a full disk. At
// "step-error" (SHARDKIT_FAULT_STEP: the step about to run) the trainer fails on that rank alone,
// outside any collective: the others must not wait for it forever. At "stall" (same step rule) that
// rank sleeps for an hour instead, alive but absent from the step's collectives, as a hung process or
// a wedged GPU would be: the other ranks' collective watchdog (SHARDKIT_COLLECTIVE_TIMEOUT; on GPUs the
// NCCL watchdog) must end the job. At "step-kill" (same step rule) that rank kills itself with SIGKILL
// as the step starts, as the kernel's OOM killer would: the others must end with an error, not hang.
// At "slow-snapshot" (SHARDKIT_FAULT_STEP: the step being saved) the snapshot's copy takes
// SHARDKIT_FAULT_DELAY_MS longer (default 1000): on the host for CPU ranks, on the copy's stream on
// GPUs, so that the time a save costs training can be checked against a known delay.
// At "swap-enospc" (same step rule) that rank's writes to its NVMe swap files fail with
// ENOSPC during the step, as on a disk that filled up under the run. At "monitor-enospc" (same step
// rule) rank 0's writes of that step's TensorBoard events and CSV rows fail with ENOSPC. At
// "slow-prune" (SHARDKIT_FAULT_STEP: the step being saved) rank 0 takes SHARDKIT_FAULT_DELAY_MS longer
// to remove the checkpoints beyond --keep-last after that save's commit.
// Without SHARDKIT_FAULT nothing happens (one cached getenv).
//
// Crash points, in protocol order:
//   save-start          the step directory exists, no shard file yet
//   shard-partial       the rank's shard .tmp file holds its first state only
//   shard-written       the rank's shard is durable under its final name, not yet reported
//   manifest.json.tmp   (rank 0) the manifest is durable under its temporary name
//   manifest.json       (rank 0) the manifest is in place: the checkpoint is committed
//   latest.tmp          (rank 0) the new `latest` is durable under its temporary name
//   latest              (rank 0) `latest` names the new checkpoint; the ranks are not told yet
#pragma once

#include <cstdint>
#include <string_view>

namespace shardkit {

// Marks the save in progress on this thread, its rank and step, for the checks below.
class FaultScope {
 public:
  FaultScope(int rank, int64_t step);
  ~FaultScope();
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;

 private:
  bool outer_active_;
  int outer_rank_;
  int64_t outer_step_;
};

// Whether SHARDKIT_FAULT names `point` for this rank and step.
bool fault_armed(std::string_view point, int rank, int64_t step);
// The same for the save in progress on this thread (false outside a FaultScope): for points deep in
// code that does not know the rank and step.
bool fault_armed(std::string_view point);
// SHARDKIT_FAULT_DELAY_MS, in milliseconds (default 1000): how long a delaying point delays.
double fault_delay_ms();
// Sleeps that long (a delaying point on the host).
void fault_delay();
// SIGKILL when armed.
void crash_point(std::string_view point);
void crash_point(std::string_view point, int rank, int64_t step);

}  // namespace shardkit
