#include "trainer/nvme/swap_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "ckpt/error.hpp"
#include "ckpt/text_format.hpp"

namespace shardkit::trainer::nvme {
namespace {

void check_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status)) {
    fail(ErrorKind::kInvalidInput, dir.string() + ": nvme_path does not exist (expected a writable directory)");
  }
  if (!std::filesystem::is_directory(status)) {
    fail(ErrorKind::kInvalidInput, dir.string() + ": nvme_path is not a directory (expected a writable directory)");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    fail(ErrorKind::kInvalidInput,
         dir.string() + ": nvme_path is not writable (" + std::strerror(errno) + "; expected a writable directory)");
  }
}

void check_free_space(const std::filesystem::path& dir, int64_t bytes, const std::string& what_needs) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) fail_errno(dir.string() + ": statvfs", errno);
  const double free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  if (free < static_cast<double>(bytes)) {
    fail(ErrorKind::kInvalidInput, dir.string() + ": " + ckpt::format_bytes(free) + " free, but " + what_needs +
                                       " needs " + ckpt::format_bytes(static_cast<double>(bytes)));
  }
}

// O_EXCL: a file of this name is either a live run's (locked) or a killed run's (replaced).
ckpt::FileDescriptor create_locked(const std::filesystem::path& path,
                                   const std::function<void(const std::string&)>& notice) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      ::close(fd);
      ckpt::FileDescriptor out(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (::flock(out.get(), LOCK_EX | LOCK_NB) != 0) fail_errno(path.string() + ": flock", errno);
      return out;
    }
    if (errno != EEXIST || attempt > 0) {
      const int e = errno;
      fail(ErrorKind::kIo, path.string() + ": cannot create the optimizer swap file: " + std::strerror(e));
    }
    {
      ckpt::FileDescriptor old(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
        fail(ErrorKind::kInvalidInput, path.string() +
                                           ": in use by a running shardkit job (its optimizer swap file is locked); "
                                           "expected no other run with this name in nvme_path");
      }
    }
    notice("notice: " + path.string() + " was left by a run that ended without removing it: replaced");
    std::filesystem::remove(path);
  }
}

}  // namespace

SwapFile::SwapFile(const std::filesystem::path& dir, const std::string& name, int64_t bytes,
                   const std::string& what_needs, const std::function<void(const std::string&)>& notice)
    : bytes_(bytes) {
  check_folder(dir);
  check_free_space(dir, bytes, what_needs);
  fd_ = create_locked(dir / name, notice);
  // From here on the file is ours: an error removes it again.
  struct RemoveOnError {
    const std::filesystem::path& path;
    bool armed = true;
    ~RemoveOnError() {
      std::error_code ec;
      if (armed) std::filesystem::remove(path, ec);
    }
  } guard{fd_.path()};
  // A file-size limit (RLIMIT_FSIZE) must fail the allocation with EFBIG, not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  if (const int rc = ::posix_fallocate(fd_.get(), 0, bytes); rc != 0) {
    fail(ErrorKind::kIo, fd_.path().string() + ": cannot allocate " + ckpt::format_bytes(static_cast<double>(bytes)) +
                             " for " + what_needs + ": " + std::strerror(rc));
  }
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  direct_ = flags >= 0 && ::fcntl(fd_.get(), F_SETFL, flags | O_DIRECT) == 0;
  if (!direct_) {
    notice("notice: " + dir.string() + " does not support O_DIRECT (tmpfs?): the optimizer swap uses buffered I/O");
  }
  guard.armed = false;
}

SwapFile::~SwapFile() {
  std::error_code ec;
  if (fd_.get() >= 0) std::filesystem::remove(fd_.path(), ec);
}

std::string rank_swap_name(comm::MpiCollective& comm, const std::string& what) {
  std::string job;
  if (comm.rank() == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    job = std::string(host) + "-" + std::to_string(::getpid());
  }
  job = comm.broadcast(job);
  return "shardkit-" + job + "-" + what + "-rank" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size()) +
         ".swap";
}

}  // namespace shardkit::trainer::nvme
