// ZeRO-Infinity's optimizer offload: a rank's fp32 states (master weights, exp_avg, exp_avg_sq) kept in
// a swap file (swap_file.hpp) instead of host memory, and visited chunk by chunk through a few aligned
// bounce buffers. The visit is a pipeline over asynchronous I/O (aio.hpp): chunk i+1 is read while the
// caller computes on chunk i and chunk i-1 is written back, so a step costs about the larger of its
// I/O and its arithmetic, not their sum.
//
// File layout: state s, chunk c at byte (s * chunks + c) * chunk_bytes; every chunk is whole on disk
// (the last one padded), so every transfer is aligned for O_DIRECT.
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

inline constexpr int kStates = 3;

struct SwapOptions {
  std::filesystem::path dir;               // offload_optimizer.nvme_path
  int64_t chunk_bytes = int64_t{1} << 20;  // aio.block_size: one chunk of one state, and the largest request
  unsigned queue_depth = 8;                // aio.queue_depth: requests in flight at most
  int buffer_count = 4;                    // bounce buffers (each a chunk of every state); at least 3
};

class StateSwapper {
 public:
  enum class Access {
    kRead,    // the states are read; the file is not changed
    kWrite,   // the caller fills every chunk; nothing is read
    kUpdate,  // read, changed by the caller, written back
  };
  // One chunk of the states: elements [offset, offset + size) of each selected state (others empty).
  struct Chunk {
    int64_t offset = 0;
    std::array<std::span<float>, kStates> states;
  };
  using Visit = std::function<void(const Chunk&)>;

  // A swap file named `file_name` in options.dir for `elements` elements of each state (errors as
  // SwapFile's). Its contents are undefined until a kWrite visit has filled them.
  StateSwapper(const SwapOptions& options, const std::string& file_name, int64_t elements,
               const std::function<void(const std::string&)>& notice);
  // What such a swap file takes in options.dir, for check_node_free_space before any rank creates one.
  static SwapNeed need(const SwapOptions& options, int64_t elements);

  int64_t elements() const noexcept { return elements_; }
  int64_t chunk_elems() const noexcept { return chunk_elems_; }
  int64_t file_bytes() const noexcept { return file_.bytes(); }
  const std::filesystem::path& path() const noexcept { return file_.path(); }
  bool direct() const noexcept { return file_.direct(); }

  // Visits every chunk in order, `states` (indices) of each, with `access`. Error(kIo) naming the file
  // when a transfer fails; the file's contents are then undefined. One visit at a time (callers on
  // several threads take turns).
  void visit(Access access, std::span<const int> states, const Visit& visit);
  // All three states.
  void visit(Access access, const Visit& visit);

 private:
  int64_t chunk_count() const noexcept { return (elements_ + chunk_elems_ - 1) / chunk_elems_; }
  AsyncIo::Batch transfer(IoOp op, int64_t chunk, std::span<const int> states);
  void run(Access access, std::span<const int> states, const Visit& visit);

  int64_t elements_;
  int64_t chunk_elems_;
  std::mutex mutex_;
  SwapFile file_;
  std::vector<AlignedBuffer> buffers_;  // declared before io_: destroyed after it has drained
  std::unique_ptr<AsyncIo> io_;
};

}  // namespace shardkit::trainer::nvme
