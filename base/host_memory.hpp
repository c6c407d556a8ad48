// The machine's memory, against which allocations sized by an input (a checkpoint's model, a
// config's micro-batch, the NVMe swap's buffers) are checked before they are made: beyond it they
// would not fail at once but fill the machine until the out-of-memory killer ends the process (or
// end in std::bad_alloc, a message that names nothing).
//
// SHARDKIT_HOST_MEMORY (a size: "256GiB", "200GB") replaces what the kernel says, both the physical
// and the available memory: some virtual machines add memory as it is used, and report a fraction of
// their limit until then, so that a plan made from /proc/meminfo at start-up would refuse a run
// that fits.
#pragma once

#include <optional>
#include <span>
#include <string>

namespace shardkit {

inline constexpr const char* kHostMemoryVariable = "SHARDKIT_HOST_MEMORY";

// The override, where set (Error(kInvalidInput) naming the variable when it is not a size).
std::optional<double> host_memory_override();

// The machine's physical memory, in bytes.
double physical_memory_bytes();

// What the kernel estimates can be allocated without swapping (MemAvailable: free memory plus the
// page cache and slabs it can reclaim); the free pages alone where /proc/meminfo does not say.
double available_memory_bytes();

// One part of what a process is about to hold, named for the message of require_physical_memory.
struct MemoryPart {
  std::string name;  // "weights", "optimizer states", ...
  double bytes = 0;
};

// Whether `parts`, held by each of the `node_ranks` processes of this machine, fit its physical memory.
bool fits_physical_memory(std::span<const MemoryPart> parts, int node_ranks = 1);

// Error(kInvalidInput) "<what> needs <total> (<part> <bytes>, ...[, on <n> ranks]), more than this
// machine's <physical> of memory[; would fit: <would_fit>]" unless fits_physical_memory(parts,
// node_ranks). The figures in the message are the machine's totals; parts of 0 bytes are left out of it.
void require_physical_memory(const std::string& what, std::span<const MemoryPart> parts, int node_ranks = 1,
                             const std::string& would_fit = "");

}  // namespace shardkit
