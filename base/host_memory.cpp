#include "base/host_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "base/error.hpp"
#include "base/text_format.hpp"

namespace shardkit {

std::optional<double> host_memory_override() {
  const char* text = std::getenv(kHostMemoryVariable);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return static_cast<double>(parse_size(text, kHostMemoryVariable));
}

double physical_memory_bytes() {
  if (const std::optional<double> bytes = host_memory_override()) return *bytes;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double available_memory_bytes() {
  if (const std::optional<double> bytes = host_memory_override()) return *bytes;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.starts_with("MemAvailable:")) return std::stod(line.substr(13)) * 1024.0;  // in kB
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

namespace {

// What the node's processes hold together.
double node_total(std::span<const MemoryPart> parts, int node_ranks) {
  double total = 0;
  for (const MemoryPart& part : parts) total += std::max(part.bytes, 0.0) * node_ranks;
  return total;
}

}  // namespace

bool fits_physical_memory(std::span<const MemoryPart> parts, int node_ranks) {
  return node_total(parts, node_ranks) <= physical_memory_bytes();
}

void require_physical_memory(const std::string& what, std::span<const MemoryPart> parts, int node_ranks,
                             const std::string& would_fit) {
  const double total = node_total(parts, node_ranks);
  const double machine = physical_memory_bytes();
  if (total <= machine) return;
  std::string detail;
  for (const MemoryPart& part : parts) {
    const double bytes = part.bytes * node_ranks;
    if (bytes <= 0) continue;  // a part that is elsewhere (on NVMe, or shared with another)
    detail += (detail.empty() ? "" : ", ") + part.name + " " + format_bytes(bytes);
  }
  if (node_ranks > 1) detail += ", on " + std::to_string(node_ranks) + " ranks";
  fail(ErrorKind::kInvalidInput, what + " needs " + format_bytes(total) + " (" + detail +
                                     "), more than this machine's " + format_bytes(machine) + " of memory" +
                                     (would_fit.empty() ? "" : "; would fit: " + would_fit));
}

}  // namespace shardkit
