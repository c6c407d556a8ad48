// One job per run directory. Two jobs saving into the same folder would overwrite each other's step
// directories and race on `latest`; the trainer takes this lock before it touches the folder.
//
// The lock is flock(2) on `<run dir>/.shardkit.lock`, whose content names the holder (host, pid, start
// time, command). The kernel releases an flock when its holder exits, however it exits, so a lock
// file left behind by a killed job is stale by construction: the next job takes it over and says
// whose it was. (flock is local to a host on some network filesystems; there the lock guards against
// a second job on the same node only.)
#pragma once

#include <filesystem>
#include <string>

#include "base/file_util.hpp"

namespace shardkit::ckpt {

inline constexpr char kLockFileName[] = ".shardkit.lock";

class RunLock {
 public:
  // Creates `run_dir` if needed and locks it for `command` (e.g. "shardkit train"). Error(kInvalidInput)
  // naming the holder when another live process holds the lock. `*previous` receives a line about a
  // stale lock taken over, or is left empty.
  RunLock(const std::filesystem::path& run_dir, const std::string& command, std::string* previous);
  ~RunLock();  // empties the file; the lock goes with the descriptor
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::filesystem::path path_;
  FileDescriptor fd_;
};

}  // namespace shardkit::ckpt
