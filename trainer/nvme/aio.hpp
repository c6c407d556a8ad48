// Asynchronous file I/O: batches of reads and writes submitted at once and waited for later, so that
// a pipeline can read ahead and write behind while the CPU computes.
//
// The implementation is io_uring through liburing (uring_io.cpp). Why io_uring and not libaio: on this
// project's 2-core development VM (ext4 on virtio, O_DIRECT, 1 MiB requests, queue depth 8) both moved
// the same bytes within noise (writes 400-605 MB/s against 440-615 MB/s, reads 715-955 MB/s against
// 595-955 MB/s), but libaio is asynchronous only with O_DIRECT: on a file system without it (the
// buffered fallback) io_submit blocks until the copy is done, while io_uring still overlaps buffered
// I/O with computation. Builds without liburing refuse to open a queue (async_io_unavailable.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

namespace shardkit::trainer::nvme {

enum class IoOp { kRead, kWrite };

struct IoRequest {
  IoOp op = IoOp::kRead;
  std::byte* buffer = nullptr;
  size_t bytes = 0;
  int64_t offset = 0;
};

// One file's queue. Not thread-safe.
class AsyncIo {
 public:
  using Batch = int64_t;

  // Implementations wait for whatever is still in flight: the kernel may not write into freed buffers.
  virtual ~AsyncIo() = default;

  // Queues the requests as one batch and returns at once (or once enough earlier requests completed
  // to make room).
  virtual Batch submit(std::span<const IoRequest> requests) = 0;
  // Returns when every request of `batch` has completed; Error(kIo) naming the file, the operation,
  // the offset and the system's error when one failed (a write at SHARDKIT_FAULT=swap-enospc fails
  // with ENOSPC, as on a full disk).
  virtual void wait(Batch batch) = 0;
  // Waits for everything in flight and forgets all batches and their errors: after a failure, before
  // the buffers they use are reused or freed.
  virtual void drain() noexcept = 0;
};

// A queue for `fd` (owned by the caller, open while the queue lives; `path` names it in errors).
// Requests longer than `request_bytes` go out in pieces of that size; at most `queue_depth` pieces
// are in flight. Error(kInvalidInput) in a build without liburing.
std::unique_ptr<AsyncIo> open_async_io(int fd, const std::filesystem::path& path, unsigned queue_depth,
                                       size_t request_bytes);

}  // namespace shardkit::trainer::nvme
