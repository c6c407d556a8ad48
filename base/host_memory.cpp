#include "base/host_memory.hpp"

#include <unistd.h>

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

void require_physical_memory(const std::string& what, std::span<const MemoryPart> parts, int node_ranks) {
  double total = 0;
  std::string detail;
  for (const MemoryPart& part : parts) {
    const double bytes = part.bytes * node_ranks;
    if (bytes <= 0) continue;  // a part that is elsewhere (on NVMe, or shared with another)
    total += bytes;
    detail += (detail.empty() ? "" : ", ") + part.name + " " + format_bytes(bytes);
  }
  const double machine = physical_memory_bytes();
  if (total <= machine) return;
  if (node_ranks > 1) detail += ", on " + std::to_string(node_ranks) + " ranks";
  fail(ErrorKind::kInvalidInput, what + " needs " + format_bytes(total) + " (" + detail +
                                     "), more than this machine's " + format_bytes(machine) + " of memory");
}

}  // namespace shardkit
