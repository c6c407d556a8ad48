// What the monitors write: scalars against DeepSpeed's x-axis, the samples consumed, and the outputs
// that take them (a TensorBoard event file, a folder of CSV files). docs/DEEPSPEED.md ("Monitors")
// lists the tags and when each is written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/file_util.hpp"

namespace shardkit::trainer::monitor {

struct Scalar {
  std::string tag;      // e.g. "Train/Samples/train_loss"
  double value = 0;     // NaN and infinities are written as they are
  int64_t samples = 0;  // the x-axis: samples consumed (DeepSpeed's global_samples)
};

// One output of the monitors, on rank 0.
class Sink {
 public:
  virtual ~Sink() = default;
  // Appends `scalars` in order and hands the bytes to the kernel (no fsync: these are metrics, and a
  // crash loses at most the last step's). Error(kIo) naming the file when a write fails.
  virtual void write(std::span<const Scalar> scalars) = 0;
  // What it writes and where, for the start-up line: "TensorBoard events to DIR/events.out.tfevents...".
  virtual std::string describe() const = 0;
};

// Writes all of `bytes` to `file` (opened for appending). At the fault point "monitor-enospc"
// (base/fault.hpp; the step of the FaultScope around the write) it fails with ENOSPC instead, as on a
// full disk.
void append(const FileDescriptor& file, std::string_view bytes);

}  // namespace shardkit::trainer::monitor
