#include "trainer/monitor/sink.hpp"

#include <cerrno>

#include "base/error.hpp"
#include "base/fault.hpp"

namespace shardkit::trainer::monitor {

void append(const FileDescriptor& file, std::string_view bytes) {
  if (fault_armed("monitor-enospc")) fail_errno(file.path().string() + ": write", ENOSPC);
  file.write_all(bytes.data(), bytes.size());
}

}  // namespace shardkit::trainer::monitor
