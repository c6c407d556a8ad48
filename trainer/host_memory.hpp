// The machine's physical memory, against which allocations sized by an input (a checkpoint's model,
// a config's micro-batch) are checked before they are made: beyond it they would not fail at once
// but fill the machine until the out-of-memory killer ends the process.
#pragma once

#include <unistd.h>

namespace shardkit::trainer {

inline double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace shardkit::trainer
