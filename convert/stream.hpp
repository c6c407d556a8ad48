// What every converter shares: options that bound memory and set the I/O threads, and progress
// reporting that many threads may advance.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "ckpt/layout.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_writer.hpp"

namespace shardkit::convert {

// Called with (bytes done, bytes in all).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct ConvertOptions {
  int64_t max_memory = int64_t{2} << 30;  // bytes of buffers in flight, all threads together
  int threads = 0;                        // I/O threads; 0 = chosen from the hardware (at most 8)
  bool force = false;                     // replace an existing output
  int64_t piece_elems = 0;                // elements per piece; 0 = derived from max_memory (tests set it small)
  ProgressFn progress;
};

// Threads to use and elements per piece so that everything a thread holds stays within max_memory:
// its pieces, and the chunk buffers of the shards it reads and writes in chunks of `chunk_elems`
// (a source checkpoint's chunk size comes from its manifest: it is counted, not trusted).
struct StreamPlan {
  int threads = 1;
  int64_t piece_elems = 0;  // fp32 elements per read/convert/write piece
};
StreamPlan plan_stream(const ConvertOptions& options, int max_useful_threads, int64_t chunk_elems);

// A byte counter that worker threads advance; reports through ProgressFn from one thread at a time.
class SharedProgress {
 public:
  SharedProgress(ProgressFn fn, int64_t total) : fn_(std::move(fn)), total_(total) {}
  void add(int64_t bytes);
  void finish();

 private:
  ProgressFn fn_;
  int64_t total_;
  std::atomic<int64_t> done_{0};
  std::mutex mutex_;
};

// Streams one rank's flat buffer of one state into `writer` (between its begin_state and end_state):
// the fragments in flat order, each read through read(tensor, offset, out) in pieces of piece.size()
// elements, zeros in the padding between and after them. Counts the bytes read in `progress`.
using ReadFn = std::function<void(int tensor, int64_t offset, std::span<float> out)>;
void stream_flat(const std::vector<ckpt::Fragment>& fragments, int64_t flat_size, const ReadFn& read,
                 std::vector<float>& piece, ckpt::ShardWriter& writer, SharedProgress& progress);

// Writes a committed checkpoint described by `meta` into `step_dir` (created here) from full tensors:
// every rank's shard on the I/O threads, each state's values read through read(state, tensor, offset,
// out) in pieces, zero padding between; then the manifest. The importers' common path.
using StateReadFn = std::function<void(int state, int tensor, int64_t offset, std::span<float> out)>;
void write_from_tensors(const ckpt::CheckpointMeta& meta, const std::filesystem::path& step_dir,
                        const StateReadFn& read, const ConvertOptions& options);

}  // namespace shardkit::convert
