// Asynchronous file I/O through io_uring (liburing): batches of reads and writes submitted at once and
// waited for later, so that a pipeline can read ahead and write behind while the CPU computes.
//
// Why io_uring and not libaio: on this project's 2-core development VM (ext4 on virtio, O_DIRECT, 1 MiB
// requests, queue depth 8) both moved the same bytes within noise (writes 400-605 MB/s against
// 440-615 MB/s, reads 715-955 MB/s against 595-955 MB/s), but libaio is asynchronous only with O_DIRECT:
// on a file system without it (the buffered fallback) io_submit blocks until the copy is done, while
// io_uring still overlaps buffered I/O with computation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace shardkit::trainer::nvme {

enum class IoOp { kRead, kWrite };

struct IoRequest {
  IoOp op = IoOp::kRead;
  std::byte* buffer = nullptr;
  size_t bytes = 0;
  int64_t offset = 0;
};

// One file's queue. Requests longer than `request_bytes` go out in pieces of that size; at most
// `queue_depth` pieces are in flight (submit waits for completions beyond that). Not thread-safe.
class AsyncIo {
 public:
  using Batch = int64_t;

  // `fd` stays owned by the caller and open while this object lives; `path` names it in errors.
  AsyncIo(int fd, std::filesystem::path path, unsigned queue_depth, size_t request_bytes);
  // Waits for whatever is still in flight: the kernel may not write into freed buffers.
  ~AsyncIo();
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  // Queues the requests as one batch and returns at once (or once enough earlier pieces completed to
  // make room).
  Batch submit(std::span<const IoRequest> requests);
  // Returns when every piece of `batch` has completed; Error(kIo) naming the file, the operation, the
  // offset and the system's error when one failed (a write at SHARDKIT_FAULT=swap-enospc fails with
  // ENOSPC, as on a full disk).
  void wait(Batch batch);
  // Waits for every piece in flight and forgets all batches and their errors: after a failure, before
  // the buffers they use are reused or freed.
  void drain() noexcept;

 private:
  struct Ring;
  struct Slot {  // one piece in flight
    Batch batch = -1;
    IoRequest piece;
  };
  struct BatchState {
    int pending = 0;
    std::string error;  // the first failure, empty if none
  };
  void queue(size_t slot);
  void reap_one();
  void complete(size_t slot, int result);

  int fd_;
  std::filesystem::path path_;
  size_t request_bytes_;
  std::unique_ptr<Ring> ring_;
  std::vector<Slot> slots_;
  std::vector<size_t> free_slots_;
  size_t unsubmitted_ = 0;
  std::map<Batch, BatchState> batches_;
  Batch next_batch_ = 0;
};

}  // namespace shardkit::trainer::nvme
