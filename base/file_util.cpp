#include "base/file_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "base/error.hpp"
#include "base/fault.hpp"
#include "base/write_target.hpp"

namespace shardkit {

FileDescriptor::FileDescriptor(const std::filesystem::path& path, int flags, int mode) : path_(path) {
  do {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT && !(flags & O_CREAT)) fail(ErrorKind::kInvalidInput, path.string() + ": no such file");
    fail_errno(path.string() + ": cannot open", err);
  }
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);  // errors surface through close() on the paths that care
}

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

int64_t FileDescriptor::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_errno(path_.string() + ": fstat", errno);
  return static_cast<int64_t>(st.st_size);
}

void FileDescriptor::pread_exact(void* buffer, size_t size, int64_t offset) const {
  auto* out = static_cast<char*>(buffer);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, out + done, size - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path_.string() + ": read at offset " + std::to_string(offset + static_cast<int64_t>(done)), errno);
    }
    if (n == 0) {
      fail(ErrorKind::kCorrupt,
           path_.string() + ": file ends at byte " + std::to_string(offset + static_cast<int64_t>(done)) +
               ", expected data up to byte " + std::to_string(offset + static_cast<int64_t>(size)) + " (truncated?)");
    }
    done += static_cast<size_t>(n);
  }
}

void FileDescriptor::write_all(const void* data, size_t size) const {
  const auto* in = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, in + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path_.string() + ": write", errno);
    }
    done += static_cast<size_t>(n);
  }
}

void FileDescriptor::fsync() const {
  if (::fsync(fd_) != 0) fail_errno(path_.string() + ": fsync", errno);
}

void FileDescriptor::close() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 && errno != EINTR) fail_errno(path_.string() + ": close", errno);
}

void start_writeback(const FileDescriptor& fd, int64_t offset, int64_t length) noexcept {
#ifdef __linux__
  ::sync_file_range(fd.get(), offset, length, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd, (void)offset, (void)length;
#endif
}

void fsync_path(const std::filesystem::path& path) {
  FileDescriptor fd(path, O_RDONLY);
  fd.fsync();
  fd.close();
}

void fsync_directory(const std::filesystem::path& dir) {
  FileDescriptor fd(dir, O_RDONLY | O_DIRECTORY);
  fd.fsync();
  fd.close();
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content, bool durable) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    FileDescriptor fd = create_fresh_file(tmp);
    fd.write_all(content.data(), content.size());
    if (durable) fd.fsync();
    fd.close();
  }
  crash_point(tmp.filename().string());
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_errno("rename " + tmp.string() + " -> " + path.string(), errno);
  if (durable) fsync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
  crash_point(path.filename().string());
}

namespace {

// What a non-regular file is, for the error that refuses it.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file";
}

}  // namespace

FileDescriptor open_input_file(const std::filesystem::path& path, ErrorKind kind) {
  FileDescriptor fd(path, O_RDONLY | O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path.string() + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    fail(kind, path.string() + ": not a regular file (" + file_type_name(st.st_mode) + ")");
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) fail_errno(path.string() + ": fcntl", errno);
  return fd;
}

void require_within_folder(const std::filesystem::path& folder, const std::filesystem::path& entry, ErrorKind kind) {
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::canonical(folder, ec);
  if (ec) return;  // the folder's own problems are reported by whoever reads it
  const std::filesystem::path target = std::filesystem::canonical(entry, ec);
  if (ec) return;
  // Component by component: /a/bc is not inside /a/b.
  const auto [r, t] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  if (r == root.end()) return;
  fail(kind, entry.string() + ": leads out of " + folder.string() + " through a symbolic link (to " + target.string() +
                 "); links inside an input folder are followed only within it (copy the file into the folder)");
}

std::string read_small_file(const std::filesystem::path& path, size_t max_bytes, ErrorKind kind) {
  const FileDescriptor fd = open_input_file(path, kind);
  const int64_t size = fd.size();
  if (size < 0 || static_cast<uint64_t>(size) > max_bytes) {
    fail(kind, path.string() + ": " + std::to_string(size) + " bytes, larger than the " + std::to_string(max_bytes) +
                   " bytes such a file may have");
  }
  std::string content(static_cast<size_t>(size), '\0');
  fd.pread_exact(content.data(), content.size(), 0);
  return content;
}

}  // namespace shardkit
