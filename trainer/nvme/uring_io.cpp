// AsyncIo on io_uring (liburing): requests are split into pieces that each take a slot; a slot is
// free again once its piece has completed (a short transfer, EAGAIN or EINTR resubmits the rest).
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/fault.hpp"
#include "trainer/nvme/aio.hpp"

namespace shardkit::trainer::nvme {
namespace {

struct Ring {
  io_uring ring{};
  explicit Ring(unsigned entries, const std::filesystem::path& path) {
    if (const int rc = io_uring_queue_init(entries, &ring, 0); rc < 0) {
      fail_errno(path.string() + ": io_uring_queue_init(" + std::to_string(entries) + ")", -rc);
    }
  }
  ~Ring() { io_uring_queue_exit(&ring); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
};

class UringIo final : public AsyncIo {
 public:
  UringIo(int fd, std::filesystem::path path, unsigned queue_depth, size_t request_bytes);
  ~UringIo() override;
  UringIo(const UringIo&) = delete;
  UringIo& operator=(const UringIo&) = delete;

  Batch submit(std::span<const IoRequest> requests) override;
  void wait(Batch batch) override;
  void drain() noexcept override;

 private:
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

UringIo::UringIo(int fd, std::filesystem::path path, unsigned queue_depth, size_t request_bytes)
    : fd_(fd), path_(std::move(path)), request_bytes_(request_bytes) {
  if (queue_depth == 0 || request_bytes == 0) {
    fail(ErrorKind::kInternal, path_.string() + ": an I/O queue needs a depth and a request size above 0");
  }
  ring_ = std::make_unique<Ring>(queue_depth, path_);
  slots_.resize(queue_depth);
  for (size_t i = queue_depth; i > 0; --i) free_slots_.push_back(i - 1);
}

UringIo::~UringIo() {
  drain();
}

AsyncIo::Batch UringIo::submit(std::span<const IoRequest> requests) {
  const Batch batch = next_batch_++;
  BatchState& state = batches_[batch];
  for (const IoRequest& r : requests) {
    for (size_t done = 0; done < r.bytes; done += request_bytes_) {
      while (free_slots_.empty()) reap_one();
      const size_t slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot].batch = batch;
      slots_[slot].piece = {r.op, r.buffer + done, std::min(request_bytes_, r.bytes - done),
                            r.offset + static_cast<int64_t>(done)};
      ++state.pending;
      queue(slot);
    }
  }
  if (unsubmitted_ > 0) {
    io_uring_submit(&ring_->ring);
    unsubmitted_ = 0;
  }
  return batch;
}

void UringIo::queue(size_t slot) {
  // Never more pieces than slots, and the ring has as many entries as slots: an entry is always free.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  const IoRequest& p = slots_[slot].piece;
  const auto bytes = static_cast<unsigned>(p.bytes);
  if (p.op == IoOp::kRead) {
    io_uring_prep_read(sqe, fd_, p.buffer, bytes, static_cast<uint64_t>(p.offset));
  } else {
    io_uring_prep_write(sqe, fd_, p.buffer, bytes, static_cast<uint64_t>(p.offset));
  }
  io_uring_sqe_set_data64(sqe, slot);
  ++unsubmitted_;
}

void UringIo::reap_one() {
  io_uring_cqe* cqe = nullptr;
  int rc = unsubmitted_ > 0 ? io_uring_submit_and_wait(&ring_->ring, 1) : io_uring_wait_cqe(&ring_->ring, &cqe);
  unsubmitted_ = 0;
  while (rc == -EINTR) rc = io_uring_wait_cqe(&ring_->ring, &cqe);
  if (rc >= 0 && cqe == nullptr) rc = io_uring_peek_cqe(&ring_->ring, &cqe);
  if (rc < 0) fail_errno(path_.string() + ": waiting for io_uring completions", -rc);
  const size_t slot = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
  const int result = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  complete(slot, result);
}

void UringIo::complete(size_t slot, int result) {
  IoRequest& p = slots_[slot].piece;
  // The swapped states live on this thread's FaultScope's rank and step (the trainer's step).
  if (p.op == IoOp::kWrite && result >= 0 && fault_armed("swap-enospc")) result = -ENOSPC;
  if (result == -EAGAIN || result == -EINTR || (result > 0 && static_cast<size_t>(result) < p.bytes)) {
    // Retried as the kernel asks, or the rest of a short transfer.
    const size_t moved = result > 0 ? static_cast<size_t>(result) : 0;
    p.buffer += moved;
    p.bytes -= moved;
    p.offset += static_cast<int64_t>(moved);
    queue(slot);
    io_uring_submit(&ring_->ring);
    unsubmitted_ = 0;
    return;
  }
  const auto it = batches_.find(slots_[slot].batch);
  if (it != batches_.end()) {
    BatchState& state = it->second;
    const char* op = p.op == IoOp::kRead ? "read" : "write";
    if (result < 0 && state.error.empty()) {
      state.error = path_.string() + ": " + op + " of " + std::to_string(p.bytes) + " bytes at offset " +
                    std::to_string(p.offset) + ": " + std::strerror(-result);
    } else if (result == 0 && state.error.empty()) {
      state.error = path_.string() + ": " + op + " at offset " + std::to_string(p.offset) +
                    " moved nothing (the file is shorter than its swapped states)";
    }
    --state.pending;
  }
  free_slots_.push_back(slot);
}

void UringIo::wait(Batch batch) {
  auto it = batches_.find(batch);
  if (it == batches_.end()) fail(ErrorKind::kInternal, path_.string() + ": waiting for an unknown I/O batch");
  while (it->second.pending > 0) reap_one();
  const std::string error = std::move(it->second.error);
  batches_.erase(it);
  if (!error.empty()) fail(ErrorKind::kIo, error);
}

void UringIo::drain() noexcept {
  try {
    while (free_slots_.size() < slots_.size()) reap_one();
  } catch (const std::exception&) {
    // The ring itself failed: nothing more will complete through it.
  }
  batches_.clear();
}

}  // namespace

std::unique_ptr<AsyncIo> open_async_io(int fd, const std::filesystem::path& path, unsigned queue_depth,
                                       size_t request_bytes) {
  return std::make_unique<UringIo>(fd, path, queue_depth, request_bytes);
}

}  // namespace shardkit::trainer::nvme
