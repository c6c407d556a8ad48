#include "ckpt/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "base/error.hpp"
#include "base/write_target.hpp"
#include "ckpt/manifest.hpp"

namespace shardkit::ckpt {
namespace {

// What the lock file says, trimmed to one line for messages.
std::string holder_of(const FileDescriptor& fd) {
  char buffer[512];
  const ssize_t n = ::pread(fd.get(), buffer, sizeof(buffer) - 1, 0);
  std::string text(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "an unknown process" : text;
}

}  // namespace

RunLock::RunLock(const std::filesystem::path& run_dir, const std::string& command, std::string* previous)
    : path_(run_dir / kLockFileName) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) fail(ErrorKind::kIo, run_dir.string() + ": cannot create directory: " + ec.message());
  // A lock file that is a link, FIFO or device would have shardkit write (and print) something outside the folder.
  fd_ = open_own_file(path_, O_RDWR | O_CREAT);
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      fail(ErrorKind::kInvalidInput, run_dir.string() + " is in use by " + holder_of(fd_) + " (lock " + path_.string() +
                                         "); one job per save directory");
    }
    fail_errno(path_.string() + ": flock", err);
  }
  if (previous) {
    previous->clear();
    if (fd_.size() > 0) {
      *previous = "took over " + path_.string() + " from " + holder_of(fd_) + ", which has exited";
    }
  }
  char host[256] = "unknown host";
  ::gethostname(host, sizeof(host) - 1);
  const std::string line =
      "pid " + std::to_string(::getpid()) + " on " + host + " since " + utc_timestamp() + " (" + command + ")\n";
  if (::ftruncate(fd_.get(), 0) != 0) fail_errno(path_.string() + ": ftruncate", errno);
  if (::pwrite(fd_.get(), line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    fail_errno(path_.string() + ": write", errno);
  }
}

RunLock::~RunLock() {
  // Emptied, not removed: unlinking would let a process that opened the old file lock it while a newer
  // one locks a new file. An empty file is a lock released cleanly; content means its holder died.
  // On failure the next job reports a stale lock, which it then takes over.
  [[maybe_unused]] const int ignored = ::ftruncate(fd_.get(), 0);
}

}  // namespace shardkit::ckpt
