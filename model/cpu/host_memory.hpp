// The machine's physical memory, against which allocations sized by an input (a checkpoint's model,
// a config's micro-batch) are checked before they are made: beyond it they would not fail at once
// but fill the machine until the out-of-memory killer ends the process.
//
// SHARDKIT_HOST_MEMORY (a size: "256GiB", "200GB") replaces what the kernel says, both the physical
// and the available memory: some virtual machines add memory as it is used, and report a fraction of
// their limit until then, so that a plan made from /proc/meminfo at start-up would refuse a run
// that fits.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "base/text_format.hpp"

namespace shardkit::model::cpu {

inline constexpr const char* kHostMemoryVariable = "SHARDKIT_HOST_MEMORY";

// The override, where set (Error(kInvalidInput) naming the variable when it is not a size).
inline std::optional<double> host_memory_override() {
  const char* text = std::getenv(kHostMemoryVariable);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return static_cast<double>(parse_size(text, kHostMemoryVariable));
}

inline double physical_memory_bytes() {
  if (const std::optional<double> bytes = host_memory_override()) return *bytes;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// What the kernel estimates can be allocated without swapping (MemAvailable: free memory plus the
// page cache and slabs it can reclaim); the free pages alone where /proc/meminfo does not say.
inline double available_memory_bytes() {
  if (const std::optional<double> bytes = host_memory_override()) return *bytes;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.starts_with("MemAvailable:")) return std::stod(line.substr(13)) * 1024.0;  // in kB
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Error(kInvalidInput) when a CPU model of `model` for batch x seq_len tokens would need `bytes` of
// activations, more than the machine has: the batch and sequence come from a config or a checkpoint.
inline void require_activation_memory(const std::string& model, int batch, int seq_len, double bytes) {
  if (bytes <= physical_memory_bytes()) return;
  fail(ErrorKind::kInvalidInput, "model " + model + ": a batch of " + std::to_string(batch) + " x " +
                                     std::to_string(seq_len) + " tokens needs " + format_bytes(bytes) +
                                     " of activations, more than this machine's " +
                                     format_bytes(physical_memory_bytes()) + " of memory");
}

}  // namespace shardkit::model::cpu
