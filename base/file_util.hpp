// POSIX file helpers with errors that name the file: an RAII file descriptor, exact positional
// reads, fsync of files and directories, and the durable small-file write (temp file, fsync, rename,
// fsync the directory) that commits manifests and `latest`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace shardkit {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  // open(2) with `flags`; throws Error(kInvalidInput) for a missing file, Error(kIo) otherwise.
  FileDescriptor(const std::filesystem::path& path, int flags, int mode = 0644);
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const noexcept { return fd_; }
  const std::filesystem::path& path() const noexcept { return path_; }
  // Size from fstat(2).
  int64_t size() const;
  // Reads exactly `size` bytes at `offset`; a short read is Error(kCorrupt) ("file ends at ...").
  void pread_exact(void* buffer, size_t size, int64_t offset) const;
  // Writes all of `data` at the current position.
  void write_all(const void* data, size_t size) const;
  void fsync() const;
  // Closes and reports a failure of close(2) (a deferred write error on some filesystems).
  void close();

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

// Asks the kernel to start writing back dirty pages of [offset, offset + length) of the file (length 0:
// to the end) without waiting for them: the final fsync then has little left to do, so writing and
// flushing overlap. Advisory: errors are ignored here and surface at the fsync.
void start_writeback(const FileDescriptor& fd, int64_t offset, int64_t length) noexcept;

// fsync(2) of a file or of a directory (so that renames and creations in it are durable).
void fsync_path(const std::filesystem::path& path);
void fsync_directory(const std::filesystem::path& dir);

// Writes `content` to `path` so that at any instant `path` holds either its old content or the new
// one: writes `path.tmp`, renames it over `path`, and with `durable` fsyncs the file before the rename
// and the directory after it. Neither is followed when it is a symbolic link: a leftover `path.tmp` is
// replaced, `path` itself is renamed over. Without `durable` the new content may still be lost in a
// crash (never torn): for checkpoints that are meant to live in the page cache.
void write_file_atomic(const std::filesystem::path& path, std::string_view content, bool durable);

inline void write_file_durable(const std::filesystem::path& path, std::string_view content) {
  write_file_atomic(path, content, true);
}

// Opens a file that shardkit reads as input (a manifest, a config, weights, tokens, a shard, `latest`)
// read-only. It must be a regular file; a symbolic link to one is followed, as users link their data.
// Anything else is Error(kInvalidInput) "<path>: not a regular file (a FIFO)": without the check a
// FIFO blocks the open and every read forever, a device streams without end, and a directory fails
// later with a puzzling message. The open itself never blocks (O_NONBLOCK, cleared once fstat(2) has
// seen a regular file).
// Anything but a regular file is Error(`kind`): kCorrupt where the file belongs to a checkpoint (a
// resume then moves past it like any damaged one).
FileDescriptor open_input_file(const std::filesystem::path& path, ErrorKind kind = ErrorKind::kInvalidInput);

// Error(`kind`) when `entry`, a path inside the input folder `folder` (a weights folder's shard or
// config.json, a checkpoint's manifest or shard), leads out of `folder` once symbolic links and `..`
// are resolved: "<entry>: leads out of <folder> through a symbolic link (to <target>) ...". Whoever
// made the folder chose its links, and one leading out would bring bytes from elsewhere on this
// machine into the result. `folder` itself may be a link (the user named it), and links that stay
// inside it are followed. An entry that does not resolve (missing, a dangling link) passes: opening it
// then reports it, and nothing outside is read. Does not defend against a folder changed meanwhile.
void require_within_folder(const std::filesystem::path& folder, const std::filesystem::path& entry,
                           ErrorKind kind = ErrorKind::kInvalidInput);

// Reads a whole input file (open_input_file) of at most `max_bytes`; a larger one is Error(`kind`)
// before anything is allocated for it.
std::string read_small_file(const std::filesystem::path& path, size_t max_bytes, ErrorKind kind = ErrorKind::kCorrupt);

}  // namespace shardkit
