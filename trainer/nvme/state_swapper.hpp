// ZeRO-Infinity's NVMe offload: a rank's states kept in a swap file (swap_file.hpp) instead of host
// memory -- the optimizer's fp32 master weights and moments in one file, stage 3's
// partition of the parameters in another (fp32 on CPU ranks, the GPU's 16-bit type on GPUs) -- and
// visited chunk by chunk through a few aligned bounce buffers.
// The visit is a pipeline over asynchronous I/O (aio.hpp): chunk i+1 is read while the caller
// computes on chunk i and chunk i-1 is written back, so a step costs about the larger of its I/O and
// its arithmetic, not their sum. Swappers of the same shape can be visited together (the optimizer
// step writes the parameters in its own pass), and a range of one state can be read on its own
// (stage 3's gathers).
//
// File layout: state s, chunk c at byte (s * chunks + c) * chunk_bytes; every chunk is whole on disk
// (the last one padded), so every transfer is aligned for O_DIRECT, and each state is contiguous. A
// chunk holds the same number of elements whatever their width (aio.block_size bytes of fp32), so
// that swaps of different widths can be visited together; a 16-bit chunk is half the bytes.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "trainer/nvme/aio.hpp"
#include "trainer/nvme/aligned_buffer.hpp"
#include "trainer/nvme/swap_file.hpp"

namespace shardkit::trainer::nvme {

inline constexpr int kMaxStates = 3;

struct SwapOptions {
  std::filesystem::path dir;               // offload_optimizer / offload_param .nvme_path
  int64_t chunk_bytes = int64_t{1} << 20;  // aio.block_size: one chunk of one fp32 state, the largest request
  unsigned queue_depth = 8;                // aio.queue_depth: requests in flight at most
  int buffer_count = 4;                    // bounce buffers (each a chunk of every state); at least 3
};

class StateSwapper;

// One asynchronous read of a range of one state (StateSwapper::start_read / finish_read); its
// aligned buffer is kept for the next read. Waits for a read still in flight when destroyed.
class RangeRead {
 public:
  // Reads into a buffer of its own, grown as ranges need.
  RangeRead() = default;
  // Reads into `buffer` (the caller's, aligned to kDirectAlignment: page-locked memory that a copy to
  // a GPU reads straight from); a range whose StateSwapper::range_bytes exceed it is Error(kInternal).
  explicit RangeRead(std::span<std::byte> buffer);
  ~RangeRead();
  RangeRead(const RangeRead&) = delete;
  RangeRead& operator=(const RangeRead&) = delete;

 private:
  friend class StateSwapper;
  std::byte* data() const noexcept { return external_.empty() ? buffer_.data() : external_.data(); }

  StateSwapper* swapper_ = nullptr;  // while a read is in flight
  AlignedBuffer buffer_;
  std::span<std::byte> external_;
  AsyncIo::Batch batch_ = 0;
  size_t skip_ = 0;  // bytes before the range's first element in the buffer
  size_t count_ = 0;
};

class StateSwapper {
 public:
  enum class Access {
    kRead,    // the states are read; the file is not changed
    kWrite,   // the caller fills every chunk; nothing is read
    kUpdate,  // read, changed by the caller, written back
  };
  // One chunk of the states: elements [offset, offset + size) of each selected state (others empty),
  // in `states` for a swap of fp32 elements, in `bits16` for one of 16-bit elements.
  struct Chunk {
    int64_t offset = 0;
    std::array<std::span<float>, kMaxStates> states;
    std::array<std::span<uint16_t>, kMaxStates> bits16;  // bf16 or fp16 bit patterns
  };
  using Visit = std::function<void(const Chunk&)>;
  // One swapper of a visit of several: how, and which of its states.
  struct Part {
    StateSwapper* swapper = nullptr;
    Access access = Access::kRead;
    std::span<const int> states;
  };

  // A swap file named `file_name` in options.dir for `elements` elements of each of `states` states
  // (1 to kMaxStates), of `element_bytes` bytes each (4: fp32; 2: 16-bit, whose chunks must stay
  // aligned for O_DIRECT, so aio.block_size a multiple of 2 * kDirectAlignment), holding this rank's
  // `contents` (named in errors); errors as need()'s and SwapFile's. Its contents are undefined until a
  // kWrite visit has filled them.
  StateSwapper(const SwapOptions& options, const std::string& file_name, int64_t elements, int states,
               const std::string& contents, const std::function<void(const std::string&)>& notice,
               int element_bytes = 4);
  // What such a swap file takes in options.dir, for check_node_free_space before any rank creates one.
  // Its settings are checked first: Error(kInvalidInput) for a chunk size that breaks O_DIRECT, or
  // bounce buffers (buffer_count x a chunk of every state) beyond the memory available.
  static SwapNeed need(const SwapOptions& options, int64_t elements, int states, const std::string& contents,
                       int element_bytes = 4);

  int64_t elements() const noexcept { return elements_; }
  int element_bytes() const noexcept { return element_bytes_; }
  int64_t chunk_elems() const noexcept { return chunk_elems_; }
  int64_t file_bytes() const noexcept { return file_.bytes(); }
  const std::filesystem::path& path() const noexcept { return file_.path(); }
  bool direct() const noexcept { return file_.direct(); }
  // "<path> (O_DIRECT)" or "<path> (buffered)", for the start-up report.
  std::string where() const { return path().string() + (direct() ? " (O_DIRECT)" : " (buffered)"); }
  // The indices of all its states, {0, ..., states - 1}.
  std::span<const int> all_states() const noexcept;

  // Visits every chunk in order, `states` (indices) of each, with `access`. Error(kIo) naming the file
  // when a transfer fails; the file's contents are then undefined. One visit at a time (callers on
  // several threads take turns).
  void visit(Access access, std::span<const int> states, const Visit& visit);
  // All its states.
  void visit(Access access, const Visit& visit);
  // Visits several swappers of the same elements and chunk size in one pass: chunk i of every part
  // at once (`visit` gets one Chunk per part, in order), each through its own pipeline.
  static void visit(std::span<const Part> parts, const std::function<void(std::span<const Chunk>)>& visit_chunks);

  // Starts reading elements [offset, offset + count) of `state` into `read`'s buffer and returns at
  // once; finish_read waits and returns them as E (float, or uint16_t for 16-bit elements), valid
  // until `read` is used again. For reads that a caller keeps ahead of its work; not to be mixed with
  // a visit on another thread.
  void start_read(RangeRead& read, int state, int64_t offset, int64_t count);
  template <typename E = float>
  std::span<const E> finish_read(RangeRead& read) {
    const std::byte* first = finish_read_bytes(read, sizeof(E));
    return {reinterpret_cast<const E*>(first), read.count_};
  }
  // The bytes of a RangeRead's buffer that hold any range of `count` elements of `element_bytes`:
  // the range rounded out to kDirectAlignment at both ends.
  static size_t range_bytes(int64_t count, int element_bytes) noexcept;

 private:
  friend class RangeRead;
  class Pipeline;
  int64_t chunk_count() const noexcept { return (elements_ + chunk_elems_ - 1) / chunk_elems_; }
  AsyncIo::Batch transfer(IoOp op, int64_t chunk, std::span<const int> states);
  const std::byte* finish_read_bytes(RangeRead& read, size_t element_bytes);

  int64_t elements_;
  int states_;
  int element_bytes_;
  int64_t chunk_elems_;
  std::mutex mutex_;
  SwapFile file_;
  std::vector<AlignedBuffer> buffers_;  // declared before io_: destroyed after it has drained
  std::unique_ptr<AsyncIo> io_;
};

}  // namespace shardkit::trainer::nvme
