// Positional writes of whole chunks into a file whose layout HDF5 has already fixed, by several threads
// at once. A durable shard bypasses the page cache (O_DIRECT) where the filesystem allows it: no copy
// into the page cache and no write-back left for the final fsync, so a rank writes at the device's
// speed. A shard that need not be durable goes through the page cache, which takes it at memory speed
// and writes it back later: there, direct I/O would only make the caller wait for the device.
// Each writer thread stages its chunk in an aligned buffer of its own (O_DIRECT needs aligned memory,
// offsets and sizes). Where O_DIRECT is refused -- at open (tmpfs) or at the first write (a filesystem
// that accepts the flag but not the alignment) -- or a chunk is not aligned, writes go through the
// page cache instead, with the same result on disk.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "base/file_util.hpp"

namespace shardkit::ckpt {

class DirectWriter {
 public:
  // Offsets and sizes that are multiples of this can go to the device directly.
  static constexpr size_t kAlignment = 4096;

  // Opens `path` (which exists) for writing by `workers` threads, chunks of at most `max_bytes`;
  // `bypass_page_cache` asks for direct I/O.
  DirectWriter(const std::filesystem::path& path, int workers, size_t max_bytes, bool bypass_page_cache);

  // Writes `size` bytes of `data` at `offset`, followed by zeros up to `padded` bytes. Distinct
  // `worker`s (0 .. workers - 1) may write concurrently. Error(kIo) names the file.
  void write(const void* data, size_t size, size_t padded, int64_t offset, int worker);

  // Whether writes so far bypassed the page cache.
  bool direct() const noexcept { return direct_.load(std::memory_order_relaxed); }

  // Closes both descriptors, reporting a deferred error.
  void close();

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  void write_all(int fd, const std::byte* data, size_t size, int64_t offset);

  std::filesystem::path path_;
  FileDescriptor buffered_;
  FileDescriptor unbuffered_;  // O_DIRECT, when the filesystem accepts it
  std::atomic<bool> direct_{false};
  size_t max_bytes_;
  std::vector<std::unique_ptr<std::byte[], Free>> staging_;  // per worker, aligned, max_bytes rounded up
};

}  // namespace shardkit::ckpt
