#include "trainer/nvme/swap_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/text_format.hpp"

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

// What a rank will put on one file system (the folders' st_dev), and the first of its folders there.
struct FileSystemUse {
  std::filesystem::path dir;
  double free = -1;  // bytes; below 0: the file system reports no size
  int64_t bytes = 0;
  std::string what;
};

std::map<uint64_t, FileSystemUse> use_by_file_system(std::span<const SwapNeed> needs) {
  std::map<uint64_t, FileSystemUse> out;
  for (const SwapNeed& need : needs) {
    check_folder(need.dir);
    struct stat st {};
    if (::stat(need.dir.c_str(), &st) != 0) fail_errno(need.dir.string() + ": stat", errno);
    FileSystemUse& use = out[static_cast<uint64_t>(st.st_dev)];
    if (use.dir.empty()) {
      struct statvfs fs {};
      if (::statvfs(need.dir.c_str(), &fs) != 0) fail_errno(need.dir.string() + ": statvfs", errno);
      use.dir = need.dir;
      if (fs.f_blocks > 0) use.free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
    }
    use.bytes += need.bytes;
    use.what += (use.what.empty() ? "" : " + ") + need.what;
  }
  return out;
}

// What is in the way of a swap file, for the error that refuses it; empty for a regular file.
std::string obstacle(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {};
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  return {};
}

// Opens an entry of nvme_path that must be a regular file of shardkit's: O_NOFOLLOW so that a link
// planted there is never followed, O_NONBLOCK so that a FIFO never blocks the open, and fstat(2) to
// refuse anything but a regular file (the entry can change between a look and the open).
FileDescriptor open_swap_entry(const std::filesystem::path& path, int flags) {
  FileDescriptor fd(path, flags | O_NOFOLLOW | O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path.string() + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    fail(ErrorKind::kInvalidInput, path.string() + ": not a regular file where the swap file goes (expected none)");
  }
  // The swap's I/O waits for each transfer: back to blocking mode.
  const int status = ::fcntl(fd.get(), F_GETFL);
  if (status < 0 || ::fcntl(fd.get(), F_SETFL, status & ~O_NONBLOCK) != 0) fail_errno(path.string() + ": fcntl", errno);
  return fd;
}

// O_EXCL: a file of this name is either a live run's (locked) or a killed run's (replaced). Anything
// else found there (a directory, a FIFO, a link, a device: nvme_path may be shared with others) is
// refused, never opened, followed or removed.
FileDescriptor create_locked(const std::filesystem::path& path, const std::function<void(const std::string&)>& notice) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd >= 0) {
      ::close(fd);
      FileDescriptor out = open_swap_entry(path, O_RDWR);
      if (::flock(out.get(), LOCK_EX | LOCK_NB) != 0) fail_errno(path.string() + ": flock", errno);
      return out;
    }
    if (errno != EEXIST || attempt > 0) {
      const int e = errno;
      fail(ErrorKind::kIo, path.string() + ": cannot create the swap file: " + std::strerror(e));
    }
    if (const std::string what = obstacle(path); !what.empty()) {
      fail(ErrorKind::kInvalidInput, path.string() + ": " + what +
                                         " is in the way of this rank's swap file (expected no entry of that name "
                                         "in nvme_path; remove it or choose another nvme_path)");
    }
    {
      const FileDescriptor old = open_swap_entry(path, O_RDONLY);
      if (::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
        fail(ErrorKind::kInvalidInput, path.string() +
                                           ": in use by a running shardkit job (its swap file is locked); "
                                           "expected no other run with this name in nvme_path");
      }
    }
    notice("notice: " + path.string() + " was left by a run that ended without removing it: replaced");
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail_errno(path.string() + ": cannot remove it", errno);
  }
}

}  // namespace

void check_node_free_space(comm::MpiCollective& comm, std::span<const SwapNeed> needs) {
  const std::map<uint64_t, FileSystemUse> mine = use_by_file_system(needs);
  // Every rank of the node learns every rank's bytes per file system.
  nlohmann::json entry = nlohmann::json::array();
  for (const auto& [device, use] : mine) entry.push_back({device, use.bytes});
  const comm::NodeCommunicator node_comm(comm.comm());
  comm::MpiCollective node(node_comm.get());
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& text : node.gather(entry.dump())) all.push_back(nlohmann::json::parse(text));
  all = nlohmann::json::parse(node.broadcast(all.dump()));
  for (const auto& [device, use] : mine) {
    if (use.free < 0) continue;
    int64_t total = 0;
    int ranks = 0;
    for (const auto& rank_entry : all) {
      for (const auto& e : rank_entry) {
        if (e[0].get<uint64_t>() != device) continue;
        total += e[1].get<int64_t>();
        ++ranks;
      }
    }
    if (use.free < static_cast<double>(total)) {
      fail(ErrorKind::kInvalidInput,
           use.dir.string() + ": " + format_bytes(use.free) + " free, but the swap files of the " +
               std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " on this node need " +
               format_bytes(static_cast<double>(total)) + " on its file system (this rank's share " +
               format_bytes(static_cast<double>(use.bytes)) + ": " + use.what + ")");
    }
  }
}

SwapFile::SwapFile(const std::filesystem::path& dir, const std::string& name, int64_t bytes,
                   const std::string& what_needs, const std::function<void(const std::string&)>& notice)
    : bytes_(bytes) {
  check_folder(dir);
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
    fail(ErrorKind::kIo, fd_.path().string() + ": cannot allocate " + format_bytes(static_cast<double>(bytes)) +
                             " for " + what_needs + ": " + std::strerror(rc));
  }
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  direct_ = flags >= 0 && ::fcntl(fd_.get(), F_SETFL, flags | O_DIRECT) == 0;
  if (!direct_) {
    // (ramfs, or tmpfs before Linux 6.6.) The page cache then holds what is swapped, as it comes and goes.
    notice("notice: " + dir.string() + " does not support O_DIRECT: " + name + " uses buffered I/O");
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
